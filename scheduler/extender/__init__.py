"""The kube-scheduler extender: wire types <-> core, the Flask app, and how it is served.

- ``wire``: the extender v1 JSON shapes (parse requests, build results);
- ``scoring``: the core's verdicts and policy scores -> filter results and 0..10 priorities
  (policy + model-version affinity + placement hints);
- ``subject``: the pod a verb is asked about, read once at the door (``PodSubject``);
- ``placement``: what every verb judges against (cache, scorers, node lookups);
- ``verbs``: one plugin per verb (``filter``, ``prioritize``, ``preempt``, ``bind``);
- ``upkeep``: keeping FGD's target workload current, and turning ready;
- ``extender``: the ``Extender``, those parts composed over the cluster cache;
- ``app``: the Flask app (``create_app``), ``metrics``, ``runtime`` (cache + watch + threads),
  ``server`` (the verbs' and probes' listeners on :mod:`gpufrag.httpserve`), ``cli``
  (``gpufrag extender``).
"""
