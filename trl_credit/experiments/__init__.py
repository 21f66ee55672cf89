"""Experiments run with the library: evaluating a model, comparing methods over seeds, and the credit lab.

- `evaluation`: avg@k, pass@k and completion length of a model on a math data set (`trl-credit eval`);
- `compare`: methods x seeds trained, evaluated and reported with confidence intervals (`trl-credit compare`);
- `lab`: procedural tasks whose decisive tokens are known, and where each method puts the credit (`trl-credit lab`).
"""
