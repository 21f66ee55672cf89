"""The credit lab: procedural tasks whose decisive tokens are known, and where each credit method puts the advantage.

`tasks` (needle, fork, rare: prior, reward and token labels), `model` (tokenizer, tiny Qwen2 and its warm-up into the
task's prior), `trainer` (`LabTrainer`, the real `CreditGRPOTrainer` recording the advantages its loss consumed),
`metrics` (credit precision, steps until solved, gradient-norm spread) and `run` (`LabConfig`, `run_lab`). The
command line is `trl_credit/cli/lab.py`.
"""
