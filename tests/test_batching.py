"""Continuous batching (attnlab.generate.batching): each request's tokens are those it gets alone from
attnlab.generate.generate, however requests of different ages, lengths and settings share rows,
join, leave and shift the KV cache's timeline."""

import random

import pytest
import torch

from attnlab.generate.batching import ContinuousBatcher, Request, generate_batched
from attnlab.generate import generate
from attnlab.models import GPT, GPTConfig


def gpt(pos="learned", context=24, seed=3, **kw):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=13, context=context, layers=2, heads=2, dim=16, tie_output=False, pos=pos, **kw)
    m = GPT(cfg).eval()
    with torch.no_grad():  # sharp predictions: greedy choices far from ties
        m.lm_head.weight.mul_(10)
    return m


def workload(n, context, seed=0):
    """n prompts of 1 … 8 tokens, each with its own budget up to the context."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(13) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    return prompts, [rng.randint(1, context - len(p)) for p in prompts]


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "relative"])
def test_greedy_tokens_equal_generate_alone(pos):
    model = gpt(pos)
    prompts, budgets = workload(12, 24)
    got = generate_batched(model, prompts, budgets, slots=3, temperature=0)
    want = [generate(model, [p], m, temperature=0)[0] for p, m in zip(prompts, budgets)]
    assert got == want


def test_a_narrow_timeline_shifts_and_still_gives_the_same_tokens():
    """width = context: the timeline fills often, so rows are compacted left and moved right."""
    model = gpt("learned", context=16)
    prompts, budgets = workload(10, 16, seed=1)
    batcher = ContinuousBatcher(model, slots=4, width=16)
    requests = batcher.run([Request(p, m, temperature=0) for p, m in zip(prompts, budgets)])
    assert batcher.shifts > 0
    want = [generate(model, [p], m, temperature=0)[0] for p, m in zip(prompts, budgets)]
    assert [list(r.prompt) + r.tokens for r in requests] == want


def test_windowed_attention_rows_see_their_own_window():
    model = gpt("rope", window=4)
    prompts, budgets = workload(8, 24, seed=2)
    got = generate_batched(model, prompts, budgets, slots=3, temperature=0)
    assert got == [generate(model, [p], m, temperature=0)[0] for p, m in zip(prompts, budgets)]


def test_sampled_tokens_do_not_depend_on_the_batch():
    """A seeded request draws what it draws alone with the same generator, whatever shares its rows."""
    model = gpt("rope")
    prompts, budgets = workload(9, 24, seed=4)
    got = generate_batched(model, prompts, budgets, slots=4, temperature=0.9, top_k=8, seed=10)
    for i, (p, m) in enumerate(zip(prompts, budgets)):
        alone = generate(model, [p], m, temperature=0.9, top_k=8, generator=torch.Generator().manual_seed(10 + i))
        assert got[i] == alone[0]
    assert got != generate_batched(model, prompts, budgets, slots=4, temperature=0.9, top_k=8, seed=11)


def test_rows_are_reused_and_steps_follow_the_longest_chains():
    """8 requests of 10 tokens through 2 rows: 4 rounds of 9 decoding steps (the first token of each
    comes from its prompt's own forward), never more rows than slots; each step returns the
    requests it finished, each once (one of a single token finishes on its prompt)."""
    model = gpt()
    batcher = ContinuousBatcher(model, slots=2)
    requests = [batcher.submit(Request([1, 2], 10, temperature=0)) for _ in range(8)]
    single = batcher.submit(Request([3], 1, temperature=0))
    rows, finished = [], []
    while batcher.busy:
        finished += batcher.step()
        rows.append(len(batcher.active))
    assert max(rows) == 2 and batcher.steps == 4 * 9
    assert len(finished) == 9 and set(finished) == {*requests, single}
    assert single.tokens and single.finish_reason == "length"


def test_eos_and_stop_end_a_request_early_and_free_its_row():
    model = gpt()
    alone = generate(model, [[5]], 20, temperature=0)[0][1:]
    eos = alone[3]
    first = alone.index(eos)
    r_eos = Request([5], 20, temperature=0, eos_id=eos)
    r_stop = Request([5], 20, temperature=0, should_stop=lambda toks: len(toks) == 6)
    r_long = Request([5], 20, temperature=0)
    ContinuousBatcher(model, slots=2).run([r_eos, r_stop, r_long])
    assert (r_eos.tokens, r_eos.finish_reason) == (alone[: first + 1], "eos")
    assert (r_stop.tokens, r_stop.finish_reason) == (alone[:6], "stop")
    assert (r_long.tokens, r_long.finish_reason) == (alone, "length")


def test_requests_can_join_while_others_run():
    model = gpt()
    batcher = ContinuousBatcher(model, slots=4)
    first = batcher.submit(Request([1], 15, temperature=0))
    for _ in range(5):
        batcher.step()
    assert batcher.column == 6
    streamed = []
    late = Request([4, 5, 6, 7, 8, 9, 10], 12, temperature=0, on_token=streamed.append)
    batcher.submit(late)  # its prompt is longer than the timeline so far: the rows move right
    batcher.run()
    assert list(first.prompt) + first.tokens == generate(model, [[1]], 15, temperature=0)[0]
    assert list(late.prompt) + late.tokens == generate(model, [[4, 5, 6, 7, 8, 9, 10]], 12, temperature=0)[0]
    assert streamed == late.tokens


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (Request([], 5), "at least one token"),
        (Request([1], 0), "at least 1"),
        (Request([1] * 20, 5), "exceed the model's context of 24"),
        (Request([1, 13], 5), "0 … 12"),
        (Request([1], 5, temperature=-0.5), "temperature is -0.5"),
        (Request([1], 5, top_p=1.5), "top_p is 1.5"),
        (Request([1], 5, top_k=-2), "top_k is -2"),
    ],
)
def test_bad_requests_are_refused_when_submitted(request_, message):
    with pytest.raises(ValueError, match=message):
        ContinuousBatcher(gpt(), slots=2).submit(request_)


def test_bad_batcher_settings_are_refused():
    with pytest.raises(ValueError, match="slots"):
        ContinuousBatcher(gpt(), slots=0)
    with pytest.raises(ValueError, match="narrower than the model's context"):
        ContinuousBatcher(gpt(), width=10)
    with pytest.raises(ValueError, match="one per prompt"):
        generate_batched(gpt(), [[1], [2]], [3])


# -- the surfaces: Python API, `attnlab sample --prompts-file`, `attnlab serve`'s /generate ----------
PROMPTS = ["to be", "that is", "or not to"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    from attnlab.cli import main

    root = tmp_path_factory.mktemp("batched")
    corpus = root / "c.txt"
    corpus.write_text("to be or not to be, that is the question. " * 100)
    argv = ["train", "gpt", "--data", str(corpus), "--preset", "nano", "--max-iters", "30", "--eval-interval", "30"]
    argv += ["--eval-iters", "1", "--no-progress", "--sample-chars", "0", "--context", "48", "--out", str(root / "run")]
    assert main(argv) == 0
    return root / "run"


def test_a_list_of_prompts_gives_each_its_own_continuation(lm_run):
    import attnlab

    m = attnlab.load(lm_run)
    alone = [m.generate(p, 20, temperature=0) for p in PROMPTS]
    assert m.generate(PROMPTS, 20, temperature=0, batch_size=2) == alone
    sampled = m.generate(PROMPTS, 20, temperature=1.0, seed=5, batch_size=2)
    assert sampled[1] == m.generate(PROMPTS[1], 20, temperature=1.0, seed=6)  # prompt i: seed + i
    assert m.generate(PROMPTS, 20, temperature=0, stop=["o"]) == [a[: a.find("o")] if "o" in a else a for a in alone]


def test_sample_prompts_file_prints_each_in_order(lm_run, tmp_path, capsys):
    from attnlab.cli import main

    one = ["sample", "--ckpt", str(lm_run), "--max-new-tokens", "20", "--temperature", "0"]
    capsys.readouterr()
    alone = []
    for p in PROMPTS:
        assert main([*one, "--prompt", p]) == 0
        alone.append(capsys.readouterr().out)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join([PROMPTS[0], "", *PROMPTS[1:]]) + "\n")  # (a blank line is skipped)
    assert main([*one, "--prompts-file", str(prompts), "--batch-size", "2"]) == 0
    assert capsys.readouterr().out == "---------------\n".join(alone)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt", "to"], "drop --prompt"),
        (["--no-cache"], "drop --no-cache"),
        (["--max-new-tokens", "46"], "ask for at most 43 new tokens"),
        (["--prompts-file", "missing.txt"], "cannot read"),
    ],
)
def test_bad_batched_sampling_is_one_line(lm_run, tmp_path, capsys, monkeypatch, extra, message):
    from attnlab.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("to be\n")
    argv = ["sample", "--ckpt", str(lm_run), "--prompts-file", "p.txt", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_serve_generates_for_requests_arriving_together(lm_run):
    import http.client
    import json
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import attnlab
    from attnlab.serve import serve

    model = attnlab.load(lm_run)
    started, box = threading.Event(), {}

    def ready(server):
        box["server"] = server
        started.set()

    threading.Thread(
        target=serve, args=(model, "text", "127.0.0.1", 0, ready), kwargs={"batch_size": 2}, daemon=True
    ).start()
    assert started.wait(10)
    port = box["server"].server_address[1]

    def post(body, path="/generate"):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", path, body if isinstance(body, str) else json.dumps(body))
        r = c.getresponse()
        return r.status, r.read().decode()

    try:
        bodies = [{"prompt": p, "max_new_tokens": 12 + i, "temperature": 0} for i, p in enumerate(PROMPTS * 2)]
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(post, bodies))
        for body, (status, text) in zip(bodies, answers):
            assert status == 200, text
            got = json.loads(text)
            want = model.generate(body["prompt"], body["max_new_tokens"], temperature=0)
            assert got == {"text": want, "tokens": body["max_new_tokens"], "finish_reason": "length"}
        status, text = post({"prompt": "to", "max_new_tokens": None, "temperature": 0})  # null: what the context leaves
        assert status == 200 and json.loads(text)["tokens"] == 46, text
        status, text = post({"prompt": "to", "max_new_tokens": 30, "temperature": 0, "stop": "o"})
        assert status == 200 and json.loads(text)["finish_reason"] == "stop" and "o" not in json.loads(text)["text"]
        for body, message in [
            ({"prompt": "to", "max_new_tokens": "many"}, "'max_new_tokens' must be an integer"),
            ({"prompt": "to", "max_new_tokens": 47}, "ask for at most 46 new tokens"),
            ({"prompt": "to", "temperature": -1}, "'temperature' must be at least 0"),
            ({"prompt": "to", "top_p": 0}, "'top_p' must be more than 0"),
            ({"prompt": "to", "max_new_tokens": 0}, "'max_new_tokens' must be at least 1"),
            ('{"prompt": "to", "max_new_tokens": ' + "9" * 5001 + "}", "the body holds a value Python refuses"),
            ('{"prompt": "to", "temperature": NaN}', "'temperature' must be a finite number"),
            ("[" * 100_000, "nested too deeply"),
            ({"prompt": "to", "colour": "red"}, "unknown field 'colour'"),
            ({"prompt": "Ω"}, "error:"),
            ('["to"]', "must be a JSON object"),
        ]:
            status, text = post(body)
            assert status == 400 and text.startswith("error:") and message in text, (body, text)
        status, page = 200, None
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/")
        page = c.getresponse().read().decode()
        assert 'id="g"' in page and "/generate" in page
    finally:
        box["server"].shutdown()


def test_serve_without_a_language_model_has_no_generate():
    import http.client
    import threading
    from pathlib import Path

    import attnlab
    from attnlab.serve import serve

    started, box = threading.Event(), {}

    def ready(server):
        box["server"] = server
        started.set()

    vit = attnlab.load(Path(__file__).parent / "fixtures" / "runs_v0_1" / "vit")
    threading.Thread(target=serve, args=(vit, "image", "127.0.0.1", 0, ready), daemon=True).start()
    assert started.wait(10)
    try:
        c = http.client.HTTPConnection("127.0.0.1", box["server"].server_address[1], timeout=10)
        c.request("POST", "/generate", "{}")
        r = c.getresponse()
        assert r.status == 404 and "needs a GPT run" in r.read().decode()
    finally:
        box["server"].shutdown()


def test_the_serving_benchmark_times_the_same_requests_three_ways():
    from attnlab.bench import serving_workload, time_serving

    model = gpt("learned", context=96)
    prompts, budgets = serving_workload(5, 13, 96)
    assert all(8 <= len(p) <= 64 and 1 <= m <= 128 and len(p) + m <= 96 for p, m in zip(prompts, budgets))
    t = time_serving(model, prompts, budgets, slots=2)
    assert list(t) == ["one by one", "fixed batches", "continuous"]
    for row in t.values():
        assert row["tokens/s"] == pytest.approx(sum(budgets) / row["s"])
        assert 0 < row["mean latency s"] <= row["s"]
    # the ceiling: forwards one at a time (one per token) over the batcher's (a prefill per request, a step)
    steps = max(budgets) - 1  # two rows, five requests: at least the longest's steps, at most all of them
    assert sum(budgets) / (5 + sum(m - 1 for m in budgets)) <= t["continuous"]["ceiling"]
    assert t["continuous"]["ceiling"] <= sum(budgets) / (5 + steps)
