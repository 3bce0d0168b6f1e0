"""The kube-scheduler extender: wire types <-> core, the Flask app, and how it is served.

- ``wire``: the extender v1 JSON shapes (parse requests, build results);
- ``scoring``: the core's verdicts and policy scores -> filter results and 0..10 priorities
  (policy + model-version affinity + placement hints);
- ``service``: the ``Extender`` (filter, prioritize, bind) over the cluster cache;
- ``app``: the Flask app (``create_app``), ``metrics``, ``runtime`` (cache + watch + threads),
  ``server`` (the verbs' and probes' listeners on :mod:`gpufrag.httpserve`), ``cli``
  (``gpufrag extender``).
"""
