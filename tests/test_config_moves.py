"""Keys that moved (issue 37): an old file, `--set`, or a run directory an older release wrote keeps
working under the new names, with one line per key; `hpctrain config migrate FILE` rewrites a file
with its comments kept. The older release is the real one: its source tree comes from git at the
commit before the moves (OLD_RELEASE), its shipped configs are loaded and migrated, and a run it
started is resumed by today's code to the weights of a run straight through."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain import config, config_moves
from hpctrain.config_moves import MOVES, MoveError, migrate_data, migrate_override, migrate_text
from tests.helpers import DIGITS, ROOT, digits_args, run_ranks
from tests.train.test_resume import SETS, assert_same, final_state

# main before the first move (hpctrain 0.1.0's key names): the old release of these tests. Its shipped
# configs are copied in OLD_CONFIGS (a checkout without the history still has them); its source tree
# comes from git for the resume test.
OLD_RELEASE = "a72531e"
OLD_CONFIGS = ROOT / "tests" / "configs_0.1.0"
ORDER = config.SECTIONS


@pytest.fixture(scope="module")
def old_src(tmp_path_factory) -> Path:
    """hpctrain's src/ as OLD_RELEASE had it (git archive: a full clone has it, a shallow one not)."""
    d = tmp_path_factory.mktemp("hpctrain-0.1.0")
    r = subprocess.run(
        f"git -C {ROOT} archive {OLD_RELEASE} src/hpctrain | tar -x -C {d}", shell=True, capture_output=True, text=True
    )
    if r.returncode:
        pytest.skip(f"the old release's source is not in this checkout's git ({OLD_RELEASE}): {r.stderr.strip()}")
    return d / "src"


def hpctrain_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, capture_output=True, text=True)


def test_an_old_key_is_read_under_its_new_name_with_one_line_each_and_both_names_are_refused():
    data = {"data": {"reprob": 0.25, "workers": 2, "recount": 3}, "optim": {"lr": 1e-3}}
    new, notes = migrate_data(data, "my.yaml")
    assert new == {"data": {"workers": 2}, "aug": {"erase_prob": 0.25, "erase_count": 3}, "optim": {"lr": 1e-3}}
    assert data["data"] == {"reprob": 0.25, "workers": 2, "recount": 3}  # the caller's mapping is left as it was
    assert notes == [
        "hpctrain: note: my.yaml: config key data.reprob is aug.erase_prob since hpctrain 0.2.0, read as "
        "aug.erase_prob (`hpctrain config migrate FILE` rewrites a file)",
        "hpctrain: note: my.yaml: config key data.recount is aug.erase_count since hpctrain 0.2.0, read as "
        "aug.erase_count (`hpctrain config migrate FILE` rewrites a file)",
    ]
    assert migrate_data({"aug": {"erase_prob": 0.1}}, "x") == ({"aug": {"erase_prob": 0.1}}, [])
    with pytest.raises(MoveError, match=r"x: both data.remode .* and aug.erase_mode are set: keep aug.erase_mode"):
        migrate_data({"data": {"remode": "rand"}, "aug": {"erase_mode": "pixel"}}, "x")
    assert migrate_override("data.remode=const", {})[0] == "aug.erase_mode=const"
    assert "--set data.remode: config key data.remode is aug.erase_mode" in migrate_override("data.remode=x", {})[1]
    assert migrate_override("data.root=/x=y", {}) == ("data.root=/x=y", None)
    # through config.load: the file's and the --set's old names, and the error as a ConfigError
    cfg = config.load(data={"data": {"reprob": 0.5}}, overrides=["data.remode=const"])
    assert (cfg.aug.erase_prob, cfg.aug.erase_mode) == (0.5, "const")
    with pytest.raises(config.ConfigError, match="both data.reprob"):
        config.load(data={"data": {"reprob": 0.5}, "aug": {"erase_prob": 0.1}})
    # a --set in either name overrides the file's value in either name, as any --set does
    assert config.load(data={"data": {"reprob": 0.5}}, overrides=["aug.erase_prob=0.1"]).aug.erase_prob == 0.1
    assert config.load(data={"aug": {"erase_prob": 0.5}}, overrides=["data.reprob=0.1"]).aug.erase_prob == 0.1


def test_keys_that_change_form_or_leave_are_read_by_their_rule_and_said():
    """train.tensorboard=false is log.trackers without tensorboard (with the trackers the file named,
    moved too); data.val_split is data.eval_splits; train.halt_at and train.mtbf_source leave, said."""
    old = {"train": {"tensorboard": False, "trackers": ["tensorboard", "mlflow"], "halt_at": 7, "mtbf_source": "x"}}
    new, notes = migrate_data(old, "f")
    assert new == {"log": {"trackers": ["mlflow"]}} and len(notes) == 4
    assert "config key train.halt_at left the config in hpctrain 0.3.0 (a test knob: HPCTRAIN_HALT_AT" in notes[-1]
    assert migrate_data({"train": {"tensorboard": True}}, "f")[0] == {}  # the default: TensorBoard stays on
    assert migrate_data({"train": {"tensorboard": False}}, "f")[0] == {"log": {"trackers": []}}
    assert migrate_data({"data": {"val_split": "minival"}}, "f")[0] == {"data": {"eval_splits": ["minival"]}}
    assert migrate_data({"data": {"val_split": "val", "root": "r"}}, "f")[0] == {"data": {"root": "r"}}
    same = {"data": {"val_split": "minival", "eval_splits": ["minival", "val"]}}
    assert migrate_data(same, "f")[0] == {"data": {"eval_splits": ["minival", "val"]}}
    with pytest.raises(MoveError, match="both choose the eval split"):
        migrate_data({"data": {"val_split": "minival", "eval_splits": ["val", "minival"]}}, "f")
    # on the command line, against the config read so far
    assert migrate_override("train.tensorboard=false", {"log": {"trackers": ["mlflow", "tensorboard"]}})[0] == (
        "log.trackers=[mlflow]"
    )
    assert migrate_override("train.halt_at=3", {})[0] is None
    # health's thresholds are fractions: 0.1.0's percentages are read as them; both names is an error
    assert migrate_data({"train": {"straggler_pct": 15.0}}, "f")[0] == {"health": {"straggler_frac": 0.15}}
    assert migrate_override("train.exclude_straggler_pct=20", {})[0] == "health.exclude_straggler_frac=0.2"
    with pytest.raises(MoveError, match="both train.straggler_pct"):
        migrate_data({"train": {"straggler_pct": 15.0}, "health": {"straggler_frac": 0.1}}, "f")
    cfg = config.load("digits_vit", ["train.tensorboard=false", "data.val_split=minival", "train.mtbf_source=y"])
    assert (cfg.log.trackers, cfg.data.eval_splits) == ((), ("minival",))


NORMS = [(pool, fc, gap) for pool in ("token", "avg") for fc in (None, True, False) for gap in ("after", "before")]


def test_the_final_norms_two_old_keys_build_the_model_the_old_release_built(old_src):
    """model.fc_norm and model.gap_norm (where the final LayerNorm goes) are one key, model.final_norm:
    every combination of the old keys, as the old release's own ModelConfig read it (a subprocess on
    its source), gives today's model the same place for the norm, or is refused as it was; the
    combinations it refused that name one place (gap_norm=before with pool=token) now load."""
    script = (
        "import json, sys\nfrom hpctrain import config\nout = []\n"
        "for pool, fc, gap in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        m = config.load(data={'model': {'pool': pool, 'fc_norm': fc, 'gap_norm': gap}}).model\n"
        "        out.append(m.has_fc_norm)\n"
        "    except config.ConfigError:\n"
        "        out.append(None)\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, json.dumps(NORMS)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(old_src), str(ROOT)])},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    then = json.loads(r.stdout)
    assert then.count(None) == 4  # fc_norm=true with gap_norm=before (2), gap_norm=before with pool=token (2)
    for (pool, fc, gap), was in zip(NORMS, then):
        data = {"model": {"pool": pool, "fc_norm": fc, "gap_norm": gap}}
        if fc is True and gap == "before":
            with pytest.raises(config.ConfigError, match="model.fc_norm=true puts the final norm after the pool"):
                config.load(data=data)
            continue
        now = config.load(data=data).model
        assert now.has_fc_norm == (was if was is not None else False), (pool, fc, gap)
        assert "fc_norm" not in config.to_dict(now) and "gap_norm" not in config.to_dict(now)


def test_the_final_norms_old_keys_are_said_refused_beside_another_place_and_overridden_by_a_set():
    new, notes = migrate_data({"model": {"fc_norm": False, "gap_norm": "before"}}, "f")
    assert new == {"model": {"final_norm": "tokens"}} and len(notes) == 2
    assert "config key model.fc_norm is model.final_norm since hpctrain 0.4.0 (true: pooled" in notes[0]
    assert migrate_data({"model": {"fc_norm": None, "gap_norm": "after", "pool": "avg"}}, "f")[0] == {
        "model": {"pool": "avg"}
    }
    with pytest.raises(MoveError, match="f: both model.fc_norm .* and model.final_norm are set"):
        migrate_data({"model": {"fc_norm": True, "final_norm": "pooled"}}, "f")
    with pytest.raises(MoveError, match="f: both model.gap_norm .* and model.final_norm are set"):
        migrate_data({"model": {"gap_norm": "before", "final_norm": "tokens"}}, "f")  # the file named both
    with pytest.raises(MoveError, match="model.gap_norm and model.final_norm=pooled place the final LayerNorm apart"):
        migrate_data({"model": {"gap_norm": "before", "final_norm": "pooled"}}, "f")
    with pytest.raises(MoveError, match="model.fc_norm='yes' was true, false or null"):
        migrate_data({"model": {"fc_norm": "yes"}}, "f")
    # a --set in the old name overrides the file's model.final_norm, as a --set does
    assert migrate_override("model.gap_norm=before", {"model": {"final_norm": "pooled"}})[0] == (
        "model.final_norm=tokens"
    )
    cfg = config.load(data={"model": {"pool": "avg", "final_norm": "tokens"}}, overrides=["model.fc_norm=true"])
    assert cfg.model.final_norm == "pooled" and cfg.model.has_fc_norm
    # a file naming both old keys (as every 0.3.0 run's config.yaml does) gets one line, the one that decided
    text = "model:\n  pool: avg\n  fc_norm: null     # timm's rule\n  gap_norm: before  # big_vision\n  width: 64\n"
    out, moved = migrate_text(text, ORDER)
    assert out == "model:\n  pool: avg\n  final_norm: tokens # big_vision\n  width: 64\n" and len(moved) == 2
    out, _ = migrate_text("model:\n  fc_norm: false\n  gap_norm: before\n", ORDER)
    assert out == "model:\n  final_norm: tokens\n"
    # the same for a move whose value changes form without merging (health's fractions)
    frac = config.load(data={"health": {"straggler_frac": 0.1}}, overrides=["train.straggler_pct=20"])
    assert frac.health.straggler_frac == 0.2


def test_migrate_text_renames_where_the_key_stands_and_keeps_comments_and_their_column():
    text = (
        "# my recipe\n"
        "data:\n"
        "  reprob: 0.25              # DeiT main.py:118\n"
        "  # the fill\n"
        "  remode: pixel\n"
        "optim:\n"
        "  recount: 7                # not data's: stays\n"
    )
    new, moved = migrate_text(text, ORDER)
    assert new == (  # data, left empty, goes; aug comes after optim, where the schema has it
        "# my recipe\n"
        "optim:\n"
        "  recount: 7                # not data's: stays\n"
        "aug:\n"
        "  erase_prob: 0.25          # DeiT main.py:118\n"
        "  # the fill\n"
        "  erase_mode: pixel\n"
    )
    assert [m.old for m in moved] == ["data.reprob", "data.remode"]
    emptied = "data:\n  reprob: 0.25\n\n# the optimizer\noptim:\n  lr: 0.1\n"
    assert migrate_text(emptied, ORDER)[0] == "\n# the optimizer\noptim:\n  lr: 0.1\naug:\n  erase_prob: 0.25\n"
    text = (
        "train:\n"
        "  epochs: 5\n"
        "  ckpt_every: 100            # often\n"
        "  tensorboard: false\n"
        "  trackers: [mlflow]         # ours\n"
        "  halt_at: 0\n"
        "data:\n"
        "  val_split: minival   # big_vision\n"
        "run:\n"
        "  name: r\n"
    )
    assert migrate_text(text, ORDER)[0] == (
        "train:\n"
        "  epochs: 5\n"
        "data:\n"
        "  eval_splits: [minival] # big_vision\n"
        "ckpt:\n"
        "  every: 100                 # often\n"
        "log:\n"
        "  trackers: [mlflow]         # ours\n"
        "run:\n"
        "  name: r\n"
    )


def test_config_cli_reads_old_names_and_migrate_rewrites_a_file_keeping_the_old_text(tmp_path):
    f = tmp_path / "my.yaml"
    f.write_text("data:\n  reprob: 0.3   # mine\n  recount: 2\n")
    r = hpctrain_cli("config", "--config", str(f), "--set", "data.remode=rand", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)["aug"]
    assert (resolved["erase_prob"], resolved["erase_count"], resolved["erase_mode"]) == (0.3, 2, "rand")
    assert len(re.findall(r"^hpctrain: note: .*config key data\.re\w+ is aug\.erase_\w+", r.stderr, re.M)) == 3
    r = hpctrain_cli("config", "migrate", str(f), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f.read_text() == "aug:\n  erase_prob: 0.3 # mine\n  erase_count: 2\n"
    assert (tmp_path / "my.yaml.bak").read_text() == "data:\n  reprob: 0.3   # mine\n  recount: 2\n"
    assert f"{f}: data.reprob → aug.erase_prob (hpctrain 0.2.0)" in r.stdout
    r = hpctrain_cli("config", "migrate", str(f), cwd=tmp_path)
    assert r.returncode == 0 and "nothing to migrate" in r.stdout
    flow = tmp_path / "flow.yaml"
    flow.write_text("data: {reprob: 0.1}\n")
    r = hpctrain_cli("config", "migrate", str(flow), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "edit it by hand" in r.stderr, r.stderr
    assert flow.read_text() == "data: {reprob: 0.1}\n" and not (tmp_path / "flow.yaml.bak").exists()


def test_migrate_says_what_it_did_with_each_key_and_names_the_keys_a_flow_style_file_holds(tmp_path):
    """Issue 56: a key that left printed `train.halt_at →  (hpctrain 0.3.0)`, one whose value is the new
    key's default went without a word, and a flow-style file was refused without naming its keys."""
    f = tmp_path / "old.yaml"
    f.write_text("train:\n  halt_at: 5\n  epochs: 3\ndata:\n  val_split: val\n  reprob: 0.2\n")
    r = hpctrain_cli("config", "migrate", str(f), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:3] == [
        f"{f}: train.halt_at removed: it left the config in hpctrain 0.3.0: "
        "a test knob: HPCTRAIN_HALT_AT=N in the task's environment",
        f"{f}: data.val_split removed: val is what its new name data.eval_splits does by default (hpctrain 0.3.0)",
        f"{f}: data.reprob → aug.erase_prob (hpctrain 0.2.0)",
    ], r.stdout
    assert f.read_text() == "train:\n  epochs: 3\naug:\n  erase_prob: 0.2\n"
    assert config.load(f) == config.load(tmp_path / "old.yaml.bak")  # nothing the old file meant is lost
    flow = tmp_path / "flow.yaml"
    flow.write_text("train: {halt_at: 5}\ndata: {val_split: minival, recount: 2}\n")
    r = hpctrain_cli("config", "migrate", str(flow), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot rename data.recount, data.val_split, train.halt_at in place (written in flow style" in r.stderr
    fixes = r.stderr.split("edit it by hand: ")[1].strip().split("; ")
    assert fixes == [
        "replace data.recount with `aug: {erase_count: 2}`",
        "replace data.val_split with `data: {eval_splits: [minival]}`",
        "drop train.halt_at (it left the config in hpctrain 0.3.0: a test knob: HPCTRAIN_HALT_AT=N in the task's "
        "environment)",
    ], r.stderr
    # a block list under the key a rule rewrites: the rewritten text did not parse (a traceback)
    block = tmp_path / "block.yaml"
    block.write_text("train:\n  tensorboard: false\nlog:\n  trackers:\n  - tensorboard\n  - mlflow\n")
    r = hpctrain_cli("config", "migrate", str(block), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"hpctrain: error: {block}: cannot rename train.tensorboard in place (")
    assert r.stderr.endswith("edit it by hand: replace train.tensorboard with `log: {trackers: [mlflow]}`\n")
    # null for timm's fc_norm is final_norm's auto: what the new name does by default, not its value
    nulls = tmp_path / "nulls.yaml"
    nulls.write_text("model:\n  fc_norm: null\n  depth: 2\n")
    r = hpctrain_cli("config", "migrate", str(nulls), cwd=tmp_path)
    assert r.returncode == 0 and nulls.read_text() == "model:\n  depth: 2\n", r.stderr
    assert f"{nulls}: model.fc_norm removed: null is what its new name model.final_norm does by default" in r.stdout


# Comment lines of the shipped configs edited by hand after a release, which no migration writes:
# (file, the line as migrate gives it, the line today). Everything else is migrate's output byte for byte.
WORKERS = (  # 0.5.0: the ImageNet recipes take the loader's workers from the task's CPUs (data.workers: auto)
    "  workers: 8\n",
    "  workers: auto             # the task's CPUs less one, at most 8 (data/workers.py)\n",
)
HAND_EDITS = (
    (
        "vit_b16_finetune_custom.yaml",
        "# model.fc_norm=null. Sources and what to change first: docs/finetune.md.\n",
        "# model.final_norm=auto. Sources and what to change first: docs/finetune.md.\n",
    ),
    (  # the header named the key by its old name (issue 56 item 10); migrate leaves comments as written
        "vit_b16_imagenet_16k_lamb.yaml",
        "(8k-32k: set data.batch_size; the lr\n",
        "(8k-32k: set data.global_batch; the lr\n",
    ),
    *(
        (name, *WORKERS)
        for name in (
            "vit_b16_finetune_384.yaml",
            "vit_b16_finetune_custom.yaml",
            "vit_b16_imagenet.yaml",
            "vit_b16_imagenet_16k_lamb.yaml",
            "vit_b16_imagenet_4k.yaml",
            "vit_s16_imagenet_90ep.yaml",
        )
    ),
)


def hand_edited(name: str, text: str) -> str:
    """`text` of the shipped config `name` with HAND_EDITS applied (each line there once)."""
    for n, was, now in HAND_EDITS:
        if n == name:
            assert text.count(was) == 1, (name, was)
            text = text.replace(was, now)
    return text


@pytest.mark.parametrize(
    "old_configs, moves",
    [
        # every key of train's that now has a section, the augmentation keys of data, DeiT-B's erasing
        # shorthand, eval_every, data.batch_size, the final norm's two keys: what the eight recipes set
        (OLD_CONFIGS, 80),
        (ROOT / "tests" / "configs_0.3.0", 2),  # model.gap_norm (S/16 90 epochs), model.fc_norm (MAE fine-tuning)
    ],
    ids=["0.1.0", "0.3.0"],
)
def test_the_old_releases_shipped_configs_load_as_todays_and_migrate_to_them_byte_for_byte(
    old_configs, moves, tmp_path
):
    olds = sorted(old_configs.glob("*.yaml"))
    assert [p.name for p in olds] == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    moved = 0
    for old in olds:
        new = ROOT / "configs" / old.name
        edited = tmp_path / "edited" / old.name  # the old file with the values changed on purpose since
        edited.parent.mkdir(exist_ok=True)
        edited.write_text(hand_edited(old.name, old.read_text()))
        assert config.to_dict(config.load(edited)) == config.to_dict(config.load(new)), old.name
        out = tmp_path / old.name
        r = hpctrain_cli("config", "migrate", str(old), "-o", str(out), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        text = out.read_text()
        text = hand_edited(old.name, text)
        assert text == new.read_text(), old.name
        moved += r.stdout.count(" → ")
    assert moved == moves


def test_docs_configs_lists_every_move():
    page = (ROOT / "docs" / "configs.md").read_text()
    for m in MOVES:
        assert f"| `{m.old}` | {f'`{m.new}`' if m.new else '—'} | {m.version} |" in page, m
    assert config_moves.MOVES[0].version == "0.2.0"


@pytest.mark.slow
def test_a_run_the_old_release_started_resumes_under_todays_names_to_the_same_weights(old_src, digits_root, tmp_path):
    """4 ranks (sharded checkpoints; DDP's buckets decide the order of every sum): a run straight
    through under today's code and names, against one that the old release started with its names
    (`data.reprob`, `data.recount`, `train.eval_every`) and halted at step 13, resumed by today's code
    from the command line the user had (the old names, read with a note each)."""
    old_sets = [*SETS, "data.reprob=0.5", "data.recount=2"]
    new_sets = [*SETS, "aug.erase_prob=0.5", "aug.erase_count=2"]
    run_ranks(4, digits_args(digits_root, tmp_path, "straight", *new_sets, "run.resume=none"))
    old_env = {"PYTHONPATH": os.pathsep.join([str(old_src), str(ROOT)])}
    old_args = old_names(digits_args(digits_root, tmp_path, "split", *old_sets, "train.halt_at=13"), old_src)
    out = run_ranks(4, old_args, env=old_env)
    assert f"from {old_src}" in hpctrain_version(old_env) and "config key" not in out[0].stdout
    saved = yaml.safe_load((tmp_path / "split" / "config.yaml").read_text())["data"]
    assert (saved["reprob"], saved["recount"]) == (0.5, 2) and "erase_prob" not in saved  # the old run's names
    out = run_ranks(4, old_names(digits_args(digits_root, tmp_path, "split", *old_sets), old_src))
    assert "resumed from" in out[0].stdout and "at step 13" in out[0].stdout
    assert "config key data.reprob is aug.erase_prob" in out[0].stdout
    assert "erase_prob: 0.5" in (tmp_path / "split" / "config.yaml").read_text()  # rewritten in today's names
    assert_same(final_state(tmp_path / "straight"), final_state(tmp_path / "split"))


def old_names(args: list[str], old_src: Path) -> list[str]:
    """A command line as the old release's user typed it: its digits config, the keys' old names."""
    back: dict[str, str] = {}
    for m in MOVES:  # the first move to a name is from 0.1.0's (data.reprob, not main's data.erase_prob)
        back.setdefault(m.new, m.old)
    out = []
    for a in args:
        key, sep, value = a.partition("=")
        out.append(f"{back[key]}={value}" if sep and key in back else a)
    return [str(old_src / "hpctrain" / "configs" / DIGITS.name) if a == str(DIGITS) else a for a in out]


def hpctrain_version(env: dict) -> str:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "--version"], env={**os.environ, **env}, capture_output=True, text=True
    ).stdout


def test_shipped_configs_profiles_and_docs_use_only_todays_names():
    """The recipes and cluster profiles read without a note; the docs name a moved key only where they
    say that it moved (the table in docs/configs.md, a line naming the release)."""
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert migrate_data(data, str(path))[1] == [], path
    said = re.compile(r"\b0\.[1-4]\.0\b|config key|^\| `")
    stale = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in MOVES:
                if re.search(rf"(?<![\w/.]){re.escape(m.old)}\b", line) and not said.search(line):
                    stale.append(f"{page.name}:{n}: {m.old}")
    assert not stale, stale
