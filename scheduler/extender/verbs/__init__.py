"""The extender's verbs, one plugin each (kube-scheduler's framework: one plugin per extension
point), every one behind the same :class:`~scheduler.extender.placement.Placement`:

- :mod:`.filter`: the nodes a pod fits, and why each other fails (or, with
  ``filter.answer: decide``, the one chosen and assumed);
- :mod:`.prioritize`: the policy + affinity score of each node, 0..10;
- :mod:`.preempt`: the fewest of kube-scheduler's candidate victims that let a pod fit a GPU;
- :mod:`.bind`: the Binding, with the GPUs decided, and the device plugin's record of them.

Filter, prioritize and preempt read their pod once, at their door, into a
:class:`~scheduler.extender.subject.PodSubject`; bind reads it from the cache (or the API
server) by the name it is sent. No HTTP here: :mod:`scheduler.extender.app` routes to them.
"""
