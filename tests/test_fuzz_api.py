"""Fuzzing drawn from the same option specs as the command line, on the other two surfaces:
``attnlab.train(family, **options)`` with hostile Python values (wrong types, NaN, huge, negative,
empty) for the options its specs declare, and the server's JSON bodies. Whatever is drawn, the
answer is a success or one ``AttnlabError`` line (Python), or a 200 / 4xx with one line (HTTP);
never another exception, a 500, or a write outside the run folder."""

import json
import math
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
from attnlab.errors import AttnlabError
from attnlab.recipes import recipes
from helpers import PINNED_TRAINING

EXAMPLES = int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", "60"))
FAMILIES = {r.name: r for r in recipes()}
# the options left alone: where the run goes, and what sets the amount of work
KEPT = {"out", "resume", "config", "data_dir", "device", "dtype", "compile", "fsdp", "progress", "threads"}
WORK = {"max_iters", "batch_size", "eval_iters", "eval_interval", "log_interval", "grad_accum", "context", "dim",
        "layers", "heads", "mlp_dim", "emb_dim", "attention_dim", "enc_layers", "dec_layers", "image_size",
        "train_scenes", "vocab_size", "max_length", "min_length", "sample_chars", "warmup_iters", "type_vocab_size",
        "readout", "patch_size", "max_objects", "lr_decay_iters", "n_images", "window", "rel_distance",
        "loss_chunk", "vocab_multiple", "pad"}  # fmt: skip
HOSTILE = [
    None,
    0,
    -1,
    1,
    2,
    0.5,
    -0.5,
    float("nan"),
    float("inf"),
    1e300,
    "",
    "x",
    "0",
    True,
    False,
    [],
    {},
    [1],
    2**70,
]
SMALL = [None, 0, -1, 1, 2, float("nan"), "", "x", True, []]  # (a huge amount of work is a long run, not an error)


@st.composite
def train_calls(draw):
    family = draw(st.sampled_from(sorted(FAMILIES)))
    specs = FAMILIES[family].train_specs()
    names = [n for n in specs.specs if n not in KEPT and n != "data"]
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    options = {}
    for name in chosen:
        spec = specs.specs[name]
        pool = SMALL if name in WORK else HOSTILE
        if spec.choices and draw(st.booleans()):
            pool = list(spec.choices)
        options[name] = draw(st.sampled_from(pool))
    return family, options


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("ATTNLAB_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(call=train_calls())
def test_any_python_training_call_succeeds_or_raises_one_attnlab_error(tmp_path, monkeypatch, call):
    family, options = call
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tmp_path))
    tiny = dict(FAMILIES[family].tiny)
    data = tiny.pop("data", None)
    small = {**tiny, **PINNED_TRAINING, "max_iters": 1, "eval_interval": 1, "eval_iters": 1, "progress": False}
    for name in ("sample_chars",):
        if name in FAMILIES[family].train_specs().specs:
            small[name] = 0
    out = tmp_path / "run"
    shutil.rmtree(out, ignore_errors=True)  # (the examples share tmp_path: each starts a new run)
    try:
        attnlab.train(family, data=data, out=out, **{**small, **options})
    except AttnlabError as e:
        assert "\n" not in str(e).strip(), (family, options, str(e))
        assert not out.exists() or any((out / n).exists() for n in ("last", "best")), (family, options)
    assert set(os.listdir(tmp_path)) - before <= {"run"}, (family, options)  # nothing written elsewhere


# ---- the server's bodies ----------------------------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
GENERATE_FIELDS = ["prompt", "max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed", "colour"]
COMPLETION_FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stop", "seed", "echo", "logprobs"]


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from attnlab import serve as serving

    model = attnlab.load(Path(__file__).parent / "fixtures" / "runs_v0_1" / "gpt")
    started, box = threading.Event(), {}
    thread = threading.Thread(
        target=serving.serve,
        args=(model, "text", "127.0.0.1", 0, lambda s: (box.update(server=s), started.set())),
        kwargs={"slots": 4},
        daemon=True,
    )
    thread.start()
    assert started.wait(20)
    yield f"http://127.0.0.1:{box['server'].server_address[1]}"
    box["server"].shutdown()


@st.composite
def bodies(draw):
    path, fields = draw(st.sampled_from([("/generate", GENERATE_FIELDS), ("/v1/completions", COMPLETION_FIELDS)]))
    keys = draw(st.lists(st.sampled_from(fields), max_size=4, unique=True))
    body = {k: draw(JSON_VALUES) for k in keys}
    if "max_new_tokens" in body or "max_tokens" in body:  # (a valid count is a short generation)
        key = "max_new_tokens" if path == "/generate" else "max_tokens"
        if isinstance(body[key], int) and not isinstance(body[key], bool) and body[key] > 8:
            body[key] = 8
    body.setdefault("max_new_tokens" if path == "/generate" else "max_tokens", 4)
    return path, body


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("ATTNLAB_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(request=bodies())
def test_any_json_body_is_answered_with_a_status_and_one_line(server, request):
    import httpx

    path, body = request
    raw = json.dumps(body, allow_nan=True)
    r = httpx.post(server + path, content=raw.encode(), timeout=60)
    assert r.status_code in (200, 400), (path, raw, r.status_code, r.text[:300])
    if r.status_code == 400:
        message = r.json()["error"]["message"] if path.startswith("/v1/") else r.text
        assert message and "\n" not in message.strip() and "Traceback" not in message, (path, raw, message)
    elif path == "/generate":
        assert isinstance(r.json()["text"], str)
    elif not body.get("stream"):
        assert all(isinstance(c["text"], str) for c in r.json()["choices"]), raw


def test_hostile_values_include_what_broke_before():
    assert math.isnan(HOSTILE[7]) and 2**70 in HOSTILE  # NaN and a seed above 64 bits are always in the pool
