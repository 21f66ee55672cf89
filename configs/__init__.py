"""Recipes shipped with trl-credit: the package `trl_credit.configs`, read with `trl_credit.resources`."""
