"""GPU right-sizing: recommend each workload's GPU share from its measured memory use.

Its own import layer, below the defrag controller and the admission webhook (which both use
it and, as siblings, may not import each other) and above the node agent, whose per-pod
readings it reads in the agent's schema (:mod:`gpufrag.gpu_usage`, in the shared base).
:mod:`defrag.rightsizing.recommender` is pure (standard library, orjson, the agent's schema);
:mod:`defrag.rightsizing.workloads` is the one place that reads and writes workloads'
controllers through the Kubernetes API.
"""
