"""Bad input never gives a traceback; run records hold no secrets and nobody else can write them."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain import config
from hpctrain.cli import main as cli_main
from tests.helpers import DIGITS, digits_args

KEYS = [k for k, _, _ in config.describe()]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True), st.text(max_size=20)
)
values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=6
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS + ["bogus.key", "model", "optim"]), values, max_size=6))
def test_any_yaml_mapping_gives_a_config_or_a_config_error(flat):
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[leaf] = value
    try:
        cfg = config.load(data=nested)
    except config.ConfigError as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert isinstance(cfg, config.Config)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_yaml_text_gives_a_config_or_a_config_error(text):
    path = f"/tmp/hpctrain-hypothesis-{os.getpid()}.yaml"
    with open(path, "w") as f:
        f.write(text)
    try:
        config.load(path)
    except config.ConfigError as e:
        assert str(e)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(KEYS + ["x", "train.", ".lr", "optim.lr.x"]), st.text(max_size=30))
def test_cli_set_values_never_traceback(key, raw):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli_main(["config", "--config", str(DIGITS), "--set", f"{key}={raw}"])
        except SystemExit as e:  # argparse's own usage error
            code = e.code
    assert code in (0, 2)
    if code:
        assert "Traceback" not in err.getvalue() and err.getvalue().strip()
        assert len(err.getvalue().strip().splitlines()) <= 3  # argparse: usage + error; ours: one line


@pytest.mark.slow
def test_run_record_is_private_and_secret_free(digits_root, tmp_path):
    secrets = {
        "MY_API_TOKEN": "tok-123-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-456-secret",
        "DB_PASSWORD": "pw-789-secret",
        "SLURM_JOB_ID": "4242",
    }
    env = dict(os.environ, OMP_NUM_THREADS="1", **secrets)
    r = subprocess.run(
        [sys.executable, *digits_args(digits_root, tmp_path, "sec", "train.max_steps=3", "ckpt.every=2")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(0),
    )  # a careless umask must not leak write access
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "sec"
    files = list(run.rglob("*"))
    assert len(files) > 5
    for p in [run, *files]:
        mode = p.stat().st_mode
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{p} is {oct(mode)}"
        if p.is_file():
            data = p.read_bytes()
            for k in ("MY_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"):
                assert secrets[k].encode() not in data, f"{k} leaked into {p}"
    env_rec = yaml.safe_load((run / "env.json").read_text())
    assert env_rec["env"]["SLURM_JOB_ID"] == "4242"
