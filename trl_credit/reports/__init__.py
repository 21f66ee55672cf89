"""What a run is read through, after or during training: its model card, its training plots and the token-credit view.

- `model_card`: the card the trainer writes at each checkpoint (and `trl-credit eval` renders again with results);
- `plots`: reward, entropy, length and method-diagnostic curves from `trainer_state.json` (`trl-credit plot`);
- `token_view`: the `token_credit.jsonl` records the trainer writes, as an HTML page or a PNG (`trl-credit inspect`).
"""
