"""`trl-credit eval`: avg@n, pass@k and mean completion length of a model on a math data set.

Example (offline):

    trl-credit eval --model_name_or_path smollm2-135m-instruct --dataset_name chain_sum --num_problems 20 \
        --n 4 --max_new_tokens 64

Without `--dataset_split` the source's held-out split is evaluated (`trl_credit.experiments.evaluation.held_out_split`: `test`,
or the only split of a source published as one). Every input is checked before the model is loaded: a bad flag or
value, an unknown data set, a missing column or a missing vLLM exits with status 2 and one line on stderr. When the
model is a `trl-credit grpo` output folder, the summary is also saved there and its model card is rendered again
with the results and the split (`--update_model_card false` leaves the folder alone).
"""

from __future__ import annotations

import json
import sys

from ..data.models import check_model_reference
from ..experiments.evaluation import (
    EvalConfig,
    check_backend_available,
    prepare_eval_data,
    run_evaluation,
    update_model_card,
)
from . import UsageError, one_line, run_command
from .outputs import check_output_folder
from .parsing import CommandParser

PROG = "trl-credit eval"


def main(argv: list[str]) -> int:
    """Run `trl-credit eval` with the arguments `argv` (without the command name); return the exit status."""
    return run_command(PROG, _evaluate, argv)


def _evaluate(argv: list[str]) -> int:
    (config,) = CommandParser(EvalConfig, prog=PROG, description=__doc__.split("\n\n")[0]).parse_config(argv)
    check_output_folder("eval", config.output_dir)
    try:
        check_model_reference(config.model_name_or_path)
        check_backend_available(config.backend)
    except ValueError as error:
        raise UsageError(one_line(error)) from error
    try:
        prepared = prepare_eval_data(config)
    except ValueError as error:  # unknown source, bad split, missing column: the message names the problem
        raise UsageError(one_line(error)) from error
    except Exception as error:  # noqa: BLE001 - an unknown Hub id, the Hub unreachable offline, an unreadable file
        raise UsageError(f"cannot load dataset {config.dataset_name!r}: {one_line(error)}") from error
    summary = run_evaluation(config, prepared=prepared)
    try:
        card = update_model_card(config, summary)
    except ValueError as error:  # the evaluation itself is saved: report, do not fail
        print(f"{PROG}: warning: model card not updated: {one_line(error)}", file=sys.stderr)
        card = None
    metrics = {key: value for key, value in summary.items() if key.startswith(("avg@", "pass@"))}
    print(
        json.dumps(
            {
                "split": summary["split"],
                **metrics,
                "mean_completion_length": summary["mean_completion_length"],
                "num_problems": summary["num_problems"],
                "output_dir": config.output_dir,
                **({"model_card": str(card)} if card is not None else {}),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
