"""Cluster-side GPU defragmentation and right-sizing.

:mod:`defrag.controller` is the defrag controller (pure planner, the executor that evicts within
budgets, one cycle per CronJob run); :mod:`defrag.rightsizing` recommends each workload's GPU
share from measured use; :mod:`defrag.admission` is the mutating admission webhook that applies it.
"""
