"""What a run is read through, after or during training: its model card, its training plots, the token-credit view, and
the tables of the docs generated from the code.

- `model_card`: the card the trainer writes at each checkpoint (and `trl-credit eval` renders again with results);
- `plots`: reward, entropy, length and method-diagnostic curves from `trainer_state.json` (`trl-credit plot`);
- `token_view`: the `token_credit.jsonl` records the trainer writes, as an HTML page or a PNG (`trl-credit inspect`);
- `doc_tables`: the generated blocks of README.md and docs/*.md (`python -m trl_credit.reports.doc_tables`).
"""
