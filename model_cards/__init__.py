"""Model-card templates shipped with trl-credit, installed as the package `trl_credit.model_cards`."""
