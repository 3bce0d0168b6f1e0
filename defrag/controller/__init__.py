"""The defrag controller (one cycle per CronJob run): measure idle memory, plan moves with the
scheduler's own policy, evict within budgets. Planning modules are pure; the executor is the one
place that writes to the cluster."""
