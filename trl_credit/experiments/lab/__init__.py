"""The credit lab: procedural tasks whose decisive tokens are known, and where each credit method puts the advantage.

`tasks` (needle, fork, mdp, rare, hitch: prior, reward and token labels, at any horizon), `model` (tokenizer, tiny
Qwen2 and its warm-up into the task's prior), `trainer` (`LabTrainer`, the real `CreditGRPOTrainer` handed the task's
decisive tokens and recording the advantages its loss consumed), `oracle` (the ground-truth credit method),
`metrics` (credit precision, steps until solved, gap closed, gradient-norm spread), `lab_config` (`LabConfig`),
`lab_runs` (`run_one`, `run_lab`) and `lab_report` (the grid's summary over seeds and `report.md`). The command line
is `trl_credit/cli/lab.py`.
"""
