"""The statistic only the credit lab supplies: which tokens the task's ground truth marks as deciding the reward."""

# 1.0 on the tokens the task marks decisive, else 0. `CreditGRPOTrainer` cannot compute it: the lab's `LabTrainer`,
# which knows the task, adds it to the statistics it supplies.
TASK_DECISIVE = "task_decisive"
