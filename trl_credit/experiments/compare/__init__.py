"""`trl-credit compare`: one training run per (method, seed), a held-out evaluation, and a report with CIs.

`plan` (configuration, runs, resume state, cost), `runner` (training subprocesses, evaluation), `compare_report`
(`report.md`, `report.html`) and `stats` (t intervals and paired differences, on SciPy's t distribution). The command
line is `trl_credit/cli/compare.py`.
"""
