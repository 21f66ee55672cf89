"""`trl-credit compare`: one training run per (method, seed), a held-out evaluation, and a report with CIs.

`plan` (configuration, runs, resume state, cost), `runner` (training subprocesses, evaluation), `report`
(`report.md`, `report.html`) and `stats` (t intervals, paired differences; no SciPy). The command line is
`trl_credit/cli/compare.py`.
"""
