"""The right-sizing mutating admission webhook (``gpufrag admission``).

It sits in the same import layer as the extender and the defrag controller (it may not import
either) and reads recommendations through :mod:`defrag.rightsizing`, the layer below.
:mod:`defrag.admission.mutate` decides (pure), :mod:`defrag.admission.review` speaks
AdmissionReview v1, :mod:`defrag.admission.server` serves it over TLS, :mod:`.cli` runs it.
"""
