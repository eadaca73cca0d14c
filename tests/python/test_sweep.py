"""tinylm.sweep and tinylm.plot: the same runs, summary and plots as the CLI."""

import csv

import numpy as np
import pytest

import tinylm

MODEL = dict(vocab_size=256, context_length=16, d_model=32, num_layers=1, num_heads=2, d_ff=64)


def base(tmp_path, steps=30):
    rng = np.random.default_rng(0)
    text = np.frombuffer(b"once upon a time a small cat found a red ball. " * 200, dtype=np.uint8)
    np.save(tmp_path / "train.npy", text.astype(np.uint16))
    np.save(tmp_path / "val.npy", rng.permutation(text[:2000]).astype(np.uint16))
    return {
        "model": MODEL,
        "train_data": str(tmp_path / "train.npy"),
        "val_data": str(tmp_path / "val.npy"),
        "batch_size": 4,
        "steps": steps,
        "warmup_steps": 2,
        "grad_clip": 0.0,
        "eval_interval": 10,
        "eval_batches": 2,
        "log_interval": 5,
        "threads": 1,
    }


def test_a_grid_with_a_diverging_point(tmp_path):
    out = tmp_path / "sweep"
    rows = tinylm.sweep(out, base(tmp_path), grid={"lr_max": [1e-2, 30.0], "d_model": [16, 32]})
    assert [r["name"] for r in rows] == [
        "lr_max=0.01,d_model=16",
        "lr_max=0.01,d_model=32",
        "lr_max=30.0,d_model=16",
        "lr_max=30.0,d_model=32",
    ]
    assert [r["status"] for r in rows] == ["finished", "finished", "diverged", "diverged"]
    assert rows[0]["steps"] == 30 and rows[0]["val_loss"] is not None
    assert all(r["diverged_step"] < 30 for r in rows[2:])
    assert rows[1]["values"] == {"lr_max": "0.01", "d_model": "32"}
    with open(out / "summary.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["status"].split(" at ")[0] for t in table] == [r["status"] for r in rows]
    for name in ["loss.svg", "loss.png", "loss_wall.svg", "loss_wall.png"]:
        assert (out / name).stat().st_size > 1000
    # Started again: nothing to do, the same results.
    assert tinylm.sweep(out, base(tmp_path), grid={"lr_max": [1e-2, 30.0], "d_model": [16, 32]}) == rows

    png = tinylm.plot(out, tmp_path / "wall.png", x="wall", log_y=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tinylm.plot([rows[0]["dir"], rows[2]["dir"]], tmp_path / "two.svg", x="tokens")
    text = svg.read_text()
    assert "lr_max" in text and "diverged" in text


def test_variants_by_name_and_by_keys(tmp_path):
    rows = tinylm.sweep(
        tmp_path / "ablations",
        base(tmp_path, steps=5),
        variants={"wide": {"d_model": 64, "num_heads": 4}, "tied": {"tie_embeddings": True}},
    )
    assert [r["name"] for r in rows] == ["wide", "tied"]
    rows = tinylm.sweep(tmp_path / "presets", base(tmp_path, steps=5), variants=["baseline,silu", "nope"])
    assert [(r["name"], r["status"]) for r in rows] == [
        ("baseline", "finished"),
        ("silu", "finished"),
        ("nope", "finished"),
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(grid={"lr_mx": [1e-3]}), "unknown key `lr_mx`"),
        (dict(grid={"lr_max": [1e-3, "fast"]}), "value `fast`"),
        (dict(grid={"lr_max": []}), "has no values"),
        (dict(variants=["sideways"]), "unknown variant `sideways`"),
        (dict(), "nothing to sweep"),
    ],
)
def test_bad_input_names_the_key_or_value(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tinylm.sweep(tmp_path / "s", base(tmp_path), **kwargs)
    assert not (tmp_path / "s").exists()


def test_plot_of_a_directory_without_runs_names_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        tinylm.plot(tmp_path / "empty", tmp_path / "x.png")
