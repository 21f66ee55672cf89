"""Token-credit records, the HTML page (checked in real headless Chromium) and the PNG export."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from fake_runs import fake_token_credit_records
from headless_chromium import needs_chromium, read_png, run_chromium

from trl_credit.cli.inspect import main as inspect_main
from trl_credit.reports import token_view

INJECTION = "<script>window.__pwned = 1</script><img src=x onerror=alert(1)>"


def record_with_weights(weights, *, step=1, advantage=0.5, tokens=None, statistic=None):
    """A record whose token weights are exactly `weights` (Â = A · w)."""
    n = len(weights)
    tokens = tokens or [f" tok{i}" for i in range(n)]
    return token_view.token_credit_record(
        step=step,
        method="eapo",
        prompt="Compute 3 + 4.",
        completion="".join(tokens),
        reward=1.0,
        advantage=advantage,
        token_ids=list(range(n)),
        token_advantages=[advantage * w for w in weights],
        logps=[-1.0] * n,
        entropies=[0.5] * n,
        tokens=tokens,
        statistic=statistic if statistic is not None else [0.1] * n,
    )


# ---------------------------------------------------------------------------------------------- records


def test_record_drops_masked_positions_and_computes_weights(tiny_tokenizer):
    ids = tiny_tokenizer.convert_tokens_to_ids(["the", "sum", "is", "7", "<pad>"])
    record = token_view.token_credit_record(
        step=2,
        method="taco",
        prompt="p",
        completion="the sum is 7",
        reward=1.0,
        advantage=torch.tensor(0.8),
        token_ids=torch.tensor(ids),
        token_advantages=torch.tensor([0.8, 0.4, 0.8, 0.8, 0.0]),
        logps=torch.tensor([-0.1, -9.0, -0.2, float("nan"), 0.0]),
        entropies=torch.zeros(5),
        mask=torch.tensor([1, 1, 1, 1, 0]),
        tokenizer=tiny_tokenizer,
        statistic=torch.tensor([-1.0, 2.0, -1.0, -1.0, 0.0]),
    )
    assert record["tokens"] == ["the", "sum", "is", "7"]
    assert record["token_ids"] == ids[:4]
    assert record["weights"] == [1.0, 0.5, 1.0, 1.0]  # float32 division: untouched tokens read exactly 1
    assert record["logps"][3] is None  # NaN is stored as JSON null
    assert record["statistic_name"] == "tail_risk"
    json.dumps(record, allow_nan=False)


def test_record_zero_advantage_has_unit_weights_and_no_statistic():
    record = token_view.token_credit_record(
        step=0,
        method="grpo",
        prompt="p",
        completion="ab",
        reward=0.0,
        advantage=0.0,
        token_ids=[5, 6],
        token_advantages=[0.0, 0.0],
        logps=[-1.0, -2.0],
        entropies=[1.0, 1.0],
        tokens=["a", "b"],
    )
    assert record["weights"] == [1.0, 1.0]
    assert record["statistic"] is None and record["statistic_name"] is None


def test_records_from_batch(tiny_tokenizer):
    ids_BT = torch.tensor(
        [
            tiny_tokenizer.convert_tokens_to_ids(["so", "7", "<pad>"]),
            tiny_tokenizer.convert_tokens_to_ids(["the", "answer", "is"]),
        ]
    )
    mask_BT = ids_BT != tiny_tokenizer.pad_token_id
    advantages_B = torch.tensor([1.0, -1.0])
    records = token_view.token_credit_records_from_batch(
        step=5,
        method="tide",
        prompts=["p0", "p1"],
        completions=["so 7", "the answer is"],
        rewards_B=torch.tensor([1.0, 0.0]),
        advantages_B=advantages_B,
        completion_ids_BT=ids_BT,
        token_advantages_BT=advantages_B[:, None] * torch.full((2, 3), 1.5),
        logps_BT=torch.zeros(2, 3),
        entropies_BT=torch.ones(2, 3),
        mask_BT=mask_BT,
        tokenizer=tiny_tokenizer,
        statistic_BT=torch.rand(2, 3),
        max_records=2,
    )
    assert [r["tokens"] for r in records] == [["so", "7"], ["the", "answer", "is"]]
    assert records[1]["weights"] == [1.5, 1.5, 1.5] and records[1]["statistic_name"] == "deviation"


def test_record_rejects_misaligned_inputs():
    with pytest.raises(token_view.TokenCreditError, match="positions"):
        token_view.token_credit_record(
            step=0,
            method="taco",
            prompt="",
            completion="",
            reward=0.0,
            advantage=1.0,
            token_ids=[1, 2, 3],
            token_advantages=[1.0, 1.0],
            logps=[0.0] * 3,
            entropies=[0.0] * 3,
            tokens=["a", "b", "c"],
        )


def test_append_read_and_select_round_trip(tmp_path):
    records = fake_token_credit_records("taco", steps=3, per_step=4)
    token_view.append_token_credit(tmp_path, records[:5])
    token_view.append_token_credit(tmp_path, records[5:])  # appending, as the trainer does at each step
    assert token_view.read_token_credit(tmp_path) == records
    assert len(token_view.select_records(records, step=2)) == 4
    assert {r["step"] for r in token_view.select_records(records, step="last")} == {3}
    assert len(token_view.select_records(records, max_completions=5)) == 5
    # A padded row keeps only its valid tokens; TACO only ever shrinks positive credit.
    assert len(records[0]["tokens"]) == 9
    assert all(0.1 <= w <= 1.0 for r in records for w in r["weights"])


def test_drop_after_a_step_keeps_the_earlier_lines_byte_for_byte(tmp_path):
    token_view.append_token_credit(tmp_path, fake_token_credit_records("taco", steps=3, per_step=2))
    path = tmp_path / token_view.TOKEN_CREDIT_FILENAME
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + "not a record\n" + "".join(lines[2:]))
    assert token_view.drop_token_credit_after(tmp_path, 1) == 4  # steps 2 and 3, 2 records each
    assert path.read_text() == "".join(lines[:2]) + "not a record\n"
    assert (
        token_view.drop_token_credit_after(tmp_path, 1) == 0 and token_view.drop_token_credit_after(tmp_path, 0) == 2
    )
    assert path.read_text() == "not a record\n"
    assert token_view.drop_token_credit_after(tmp_path / "no-run", 0) == 0


def test_read_reports_the_bad_line(tmp_path):
    good = json.dumps(record_with_weights([1.0]))
    (tmp_path / token_view.TOKEN_CREDIT_FILENAME).write_text(good + "\n" + json.dumps({"step": 1}) + "\n")
    with pytest.raises(token_view.TokenCreditError, match=r":2: .*lacks"):
        token_view.read_token_credit(tmp_path)


# ---------------------------------------------------------------------------------------------- colours


def test_weight_colours_diverge_around_one():
    assert token_view.weight_hex(1.0) == "#ffffff"
    assert token_view.weight_rgb(0.25) == token_view.weight_rgb(0.01) == (214, 96, 77)  # saturated red
    assert token_view.weight_rgb(4.0) == token_view.weight_rgb(100.0) == (67, 147, 195)  # saturated blue
    red, _, blue = token_view.weight_rgb(0.7)
    assert 214 < red < 255 and blue < red  # a light red, between white and the saturated end
    red, _, blue = token_view.weight_rgb(1.5)
    assert 67 < red < blue
    for undefined in (None, 0.0, -1.0, math.nan):
        assert token_view.weight_hex(undefined) == "#ffffff"


def test_visible_token_text_shows_whitespace():
    assert token_view.visible_token_text("a\nb") == "a\u21b5\nb"
    assert token_view.visible_token_text("\t") == "\u21e5\t"
    assert token_view.visible_token_text("\x00") == "\\x00"
    assert token_view.visible_token_text("") == "\u2205"
    assert token_view.visible_token_text("  x") == "  x"


# ---------------------------------------------------------------------------------------------- HTML


def test_html_is_self_contained_and_escapes_tokens():
    page = token_view.render_token_credit_html([record_with_weights([0.5, 2.0], tokens=[INJECTION, "a\nb"])])
    assert INJECTION not in page and "&lt;script&gt;window.__pwned" in page
    tags = _parse_tags(page)
    assert [name for name, _ in tags].count("script") == 1 and "img" not in [name for name, _ in tags]
    # No external resources of any kind: the page must open offline.
    assert not [attrs for _, attrs in tags if {"src", "href"} & set(attrs)]
    assert not re.search(r"@import|url\(|https?://", page, flags=re.IGNORECASE)
    assert f'style="background-color: {token_view.weight_hex(0.5)}"' in page
    assert page.count('class="tok"') == 2
    title = next(attrs["title"] for name, attrs in tags if attrs.get("class") == "tok")
    assert "weight Â/A = 0.500" in title and "log p = -1.000 (p = 0.368)" in title
    assert "entropy = 0.500 nats" in title and "normalized_entropy = 0.100" in title
    assert 'data-sign="pos"' in page


def _parse_tags(page: str) -> list[tuple[str, dict]]:
    """The (name, attributes) of every start tag, as a browser's tokenizer would see them."""
    from html.parser import HTMLParser

    tags = []

    class Collector(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append((tag, dict(attrs)))

    Collector().feed(page)
    return tags


# ---------------------------------------------------------------------------------------------- CLI


def test_inspect_missing_run_dir_exits_2(tmp_path, capsys):
    assert inspect_main([str(tmp_path / "nope")]) == 2
    assert inspect_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "does not exist" in err[0] and "log_token_credit=True" in err[1]


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--max-completions", "-3"],
            "argument --max-completions: must be an integer >= 0 (0 shows them all), got '-3'",
        ),
        (["--max-completions", "many"], "argument --max-completions: must be an integer >= 0"),
        (["--png", "--png-completions", "-1"], "argument --png-completions: must be an integer >= 1, got '-1'"),
        (["--png", "--png-completions", "0"], "argument --png-completions: must be an integer >= 1, got '0'"),
        (["--png-completions", "2"], "--png-completions sets the PNG's size; add --png to write one"),
        (["--step", "first"], "argument --step: expected an integer step or 'last', got 'first'"),
    ],
)
def test_inspect_refuses_bad_counts_in_one_line_writing_nothing(tmp_path, capsys, argv, message):
    token_view.append_token_credit(tmp_path, fake_token_credit_records("eapo", steps=1, per_step=12))
    page = tmp_path / "page.html"
    assert inspect_main([str(tmp_path), "--output", str(page), *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith(f"trl-credit inspect: error: {message}")
    assert not page.exists() and not page.with_suffix(".png").exists()


def test_dispatcher_runs_inspect(tmp_path, capsys):
    from trl_credit.cli import main as cli_main

    assert cli_main(["inspect", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("trl-credit inspect: ")


def test_inspect_writes_html_and_png(tmp_path):
    token_view.append_token_credit(tmp_path, fake_token_credit_records("eapo", steps=3, per_step=4))
    out = tmp_path / "view" / "page.html"
    assert (
        inspect_main([str(tmp_path), "--step", "last", "--max-completions", "3", "--output", str(out), "--png"]) == 0
    )
    page = out.read_text()
    assert page.count('class="completion"') == 3 and 'data-step="3"' in page and 'data-step="1"' not in page
    image = read_png(out.with_suffix(".png"))
    assert _has_colour(image, (67, 147, 195)) or _has_colour(image, (214, 96, 77), tol=60)
    assert inspect_main([str(tmp_path), "--step", "99"]) == 2


def test_inspect_shows_the_completions_whose_credit_changed(tmp_path, capsys):
    # Built so that the answer is known: 2 of 5 completions carry a weight other than 1, the first drawn ones do not.
    weights = [[1.0, 1.0], [1.0, 1.0, 1.0], [0.25, 1.0], [1.0, 1.0], [1.0, 4.0]]
    token_view.append_token_credit(tmp_path, [record_with_weights(w, step=3) for w in weights])
    out = tmp_path / "page.html"
    assert inspect_main([str(tmp_path), "--output", str(out), "--png", "--png-completions", "1"]) == 0
    printed = capsys.readouterr().out
    assert "showing 2 of 5 completions where credit changed; --all shows every one" in printed
    page = out.read_text()
    assert page.count('class="completion"') == 2 and "showing 2 of 5 completions where credit changed" in page
    assert _has_colour(_token_area(out.with_suffix(".png")), (214, 96, 77))  # the w = 0.25 token, not a white page

    assert inspect_main([str(tmp_path), "--all", "--output", str(out), "--png", "--png-completions", "1"]) == 0
    assert "showing all 5 completions" in capsys.readouterr().out
    assert out.read_text().count('class="completion"') == 5
    assert not _has_colour(_token_area(out.with_suffix(".png")), (214, 96, 77))  # the first completion is untouched


def test_inspect_shows_every_completion_when_no_credit_changed(tmp_path, capsys):
    token_view.append_token_credit(tmp_path, [record_with_weights([1.0, 1.0], step=1) for _ in range(3)])
    assert inspect_main([str(tmp_path), "--output", str(tmp_path / "page.html")]) == 0
    assert "credit changed in none of the 3 completions" in capsys.readouterr().out
    assert (tmp_path / "page.html").read_text().count('class="completion"') == 3


def _expand_steps(listing: str) -> list[int]:
    """`1-3, 5` -> [1, 2, 3, 5]."""
    steps = []
    for part in listing.split(", "):
        first, _, last = part.partition("-")
        steps += range(int(first), int(last or first) + 1)
    return steps


@pytest.mark.parametrize("logging_steps,logging_first_step,max_steps", [(1, False, 3), (2, True, 4)])
def test_token_credit_steps_are_the_logged_steps_of_a_real_run(
    tmp_path, capsys, make_trainer, logging_steps, logging_first_step, max_steps
):
    """token_credit.jsonl, inspect and trainer_state.json number steps one way: TRL's logged optimizer steps."""
    trainer = make_trainer(
        "taco",
        output_dir=tmp_path,
        log_token_credit=True,
        max_steps=max_steps,
        logging_steps=logging_steps,
        logging_first_step=logging_first_step,
        token_credit_samples=4,
    )
    trainer.train()
    trainer.save_state()
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    logged_steps = [entry["step"] for entry in history if "reward" in entry]
    records = token_view.read_token_credit(tmp_path)
    assert sorted({record["step"] for record in records}) == logged_steps
    # Every row is recorded (token_credit_samples = batch size): where a log entry reports one batch (the previous
    # step was logged too), its mean reward is that of the records labelled with its step.
    reward_by_step = {entry["step"]: entry["reward"] for entry in history if "reward" in entry}
    one_batch_steps = [step for step in logged_steps if step == 1 or step - 1 in reward_by_step]
    assert one_batch_steps
    for step in one_batch_steps:
        rewards = [record["reward"] for record in records if record["step"] == step]
        assert len(rewards) == trainer.args.per_device_train_batch_size
        assert sum(rewards) / len(rewards) == pytest.approx(reward_by_step[step], abs=1e-5)

    assert inspect_main([str(tmp_path), "--step", str(logged_steps[-1]), "--all"]) == 0
    capsys.readouterr()
    missing = max(logged_steps) + 1
    assert inspect_main([str(tmp_path), "--step", str(missing)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"trl-credit inspect: no completions recorded at step {missing}; recorded steps: ")
    assert _expand_steps(line.rsplit(": ", 1)[1]) == logged_steps


def test_the_quick_start_image_shows_credit():
    """docs/images/quickstart_token_credit.png is drawn from the committed records, and shows changed credit."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    images = root / "docs" / "images"
    records = token_view.read_token_credit(root / "results" / "quickstart_token_credit.jsonl")
    changed = [record for record in records if any(w != 1.0 for w in record["weights"] if w is not None)]
    assert changed and len(changed) < len(records)
    assert f"shows the {len(changed)} of {len(records)} completions" in (images.parent / "cli.md").read_text()
    tokens = _token_area(images / "quickstart_token_credit.png")
    tinted = (tokens[..., 0] - tokens[..., 2] > 40).sum()  # red boxes of tokens whose credit TACO cut
    assert tinted > 200, "the README's token-credit image is white"


# ---------------------------------------------------------------------------------------------- Chromium


def _token_area(path, dpi=150):
    """The PNG above its colour bar (the bottom 0.6 inch, whose scale holds every colour)."""
    return read_png(path)[: -int(0.6 * dpi)]


def _has_colour(image, rgb, tol=3, min_pixels=50):
    """Whether at least `min_pixels` pixels are within `tol` of `rgb` in every channel."""
    close = (abs(image - torch.tensor(rgb).numpy()) <= tol).all(axis=-1)
    return int(close.sum()) >= min_pixels


@pytest.fixture
def page_path(tmp_path):
    records = [
        record_with_weights(
            [0.25, 1.0, 4.0],
            step=1,
            tokens=[" penalised" * 2, " neutral" * 2, " boosted" * 2],
            statistic=[0.9, 0.1, 0.2],
        ),
        record_with_weights(
            [1.0, 1.0], step=2, advantage=-0.5, tokens=[INJECTION, "line\nbreak"], statistic=[0.1, 0.2]
        ),
    ]
    return token_view.write_token_credit_html(records, tmp_path / "token_credit.html")


@needs_chromium
def test_chromium_renders_coloured_tokens(tmp_path, page_path):
    dom = run_chromium(tmp_path, page_path.as_uri(), "--dump-dom")
    spans = re.findall(r'<span class="tok" style="background-color: (#[0-9a-f]{6})"', dom)
    assert spans == ["#d6604d", "#ffffff", "#4393c3", "#ffffff", "#ffffff"]
    assert "2 shown" in dom  # the inline script ran
    assert "window.__pwned" in dom and "<img src=x" not in dom  # the injected markup stayed text
    assert "line\u21b5\nbreak" in dom

    screenshot = tmp_path / "shot.png"
    run_chromium(tmp_path, page_path.as_uri(), f"--screenshot={screenshot}")
    image = read_png(screenshot)
    assert image.std() > 10, "blank screenshot"
    assert _has_colour(image, (214, 96, 77)), "no red (w = 0.25) token box"
    assert _has_colour(image, (67, 147, 195)), "no blue (w = 4) token box"


@needs_chromium
def test_chromium_filters_from_query(tmp_path, page_path):
    dom = run_chromium(tmp_path, page_path.as_uri() + "?sign=neg", "--dump-dom")
    assert "1 shown" in dom
    assert re.search(r'class="completion hidden" data-step="1"', dom)
    dom = run_chromium(tmp_path, page_path.as_uri() + "?threshold=0.5", "--dump-dom")
    assert "1 shown" in dom and re.search(r'class="completion hidden" data-step="2"', dom)
    assert dom.count('class="tok dim"') == 4  # every token but the one with statistic 0.9
