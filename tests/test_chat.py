"""Open models in real use (issue 65): a random-weight Qwen2 checkpoint built by ``transformers``
whose config names two end-of-sequence ids and whose tokenizer carries a ChatML template. Greedy
text stops where ``transformers``' ``generate`` stops, on every generation path (eager, the
fixed-shape decoder, continuous batching, speculative), and the end token is not shown; the chat
prompt is ``apply_chat_template``'s ids; the settings survive a run started from the checkpoint
and an export."""

import json

import pytest
import torch

import attnlab
from attnlab.errors import OptionError
from attnlab.generate import generate, generate_text
from attnlab.generate.batching import generate_batched
from attnlab.generate.fast import fast_decoder, why_not_fast
from attnlab.interop import export_hf
from attnlab.tokens.chat import ChatTemplate, ChatTemplateError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# a template with what real ones use: a system default, bos_token, loop controls, tojson, raise_exception
RICH = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are kind.<|im_end|>\\n' }}"
    "{% endif %}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "{% if loop.index0 > 5 %}{% break %}{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim }}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 20


def tokenizer_object():
    from attnlab.tokens import BPETokenizer

    return BPETokenizer.train(TEXT, vocab_size=300, special_tokens=SPECIALS).hf_tokenizer()


FAMILIES = {  # random-weight instruct checkpoints of three families (Gemma 2: its soft-caps and windows too)
    "Qwen2Config": dict(num_attention_heads=4, num_key_value_heads=2),
    "LlamaConfig": dict(num_attention_heads=4, num_key_value_heads=1),
    "Gemma2Config": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=6,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
    ),  # fmt: skip
}


def instruct_checkpoint(d, config_class: str = "Qwen2Config") -> dict:
    """A HuggingFace folder of ``config_class``: random weights, a ChatML tokenizer, and as
    end-of-sequence ids the token greedy decoding of the test prompt reaches between its 5th and
    12th (so it stops there) and <|im_end|>."""
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object(), eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    config = getattr(transformers, config_class)(vocab_size=len(tok), hidden_size=64, intermediate_size=112,
                                                 num_hidden_layers=2, max_position_embeddings=256, bos_token_id=None,
                                                 eos_token_id=None, pad_token_id=None,
                                                 **FAMILIES[config_class])  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.normal_(0, 0.2)
    prompt = tok(PROMPT, return_tensors="pt").input_ids
    free = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, prompt.shape[1] :].tolist()
    k = next(i for i in range(4, 12) if free[i] not in free[:i])
    ends = [free[k], tok.convert_tokens_to_ids("<|im_end|>")]
    model.config.eos_token_id = ends
    model.generation_config.eos_token_id = ends
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return {"path": d, "hf": model, "tok": tok, "ends": ends, "stop_at": k, "free": free}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The Qwen2 instruct checkpoint most tests here share."""
    return instruct_checkpoint(tmp_path_factory.mktemp("qwen"))


PROMPT = "To be, or not"


def hf_greedy(checkpoint, ids, n=40):
    out = checkpoint["hf"].generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_end_of_sequence_ids_are_read_and_greedy_text_stops_where_transformers_stops(family, checkpoint, tmp_path):
    if family != "Qwen2Config":
        checkpoint = instruct_checkpoint(tmp_path, family)
    model = attnlab.load(checkpoint["path"])
    assert model.eos_ids == tuple(checkpoint["ends"])
    ids = model.tokenizer.encode(PROMPT)
    theirs = hf_greedy(checkpoint, ids)
    k = checkpoint["stop_at"]
    assert len(theirs) == k + 1 and theirs[-1] in checkpoint["ends"]  # (transformers keeps the end token)
    # eager, with and without the KV cache, and the fixed-shape decoder (uncompiled here: the same step)
    assert generate(model, [ids], 40, temperature=0.0, eos_id=model.eos_ids)[0][len(ids) :] == theirs
    assert generate(model, [ids], 40, temperature=0.0, eos_id=model.eos_ids, use_cache=False)[0][len(ids) :] == theirs
    if why_not_fast(model) is None:  # (Gemma 2's windows decode eagerly)
        fast = fast_decoder(model, 1, compile=False, length=len(ids) + 40)
        new = fast.generate(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool), 40,
                            lambda logits: logits.argmax(-1), eos_id=model.eos_ids)  # fmt: skip
        assert new[0].tolist() == theirs
    # continuous batching, beside a prompt that runs to its length
    batched = generate_batched(model, [ids, ids[:3]], 40, temperature=0.0, eos_id=model.eos_ids, slots=2)
    assert batched[0][len(ids) :] == theirs
    # speculative, with the model as its own draft
    spec = generate(model, [ids], 40, temperature=0.0, eos_id=model.eos_ids, draft=model, draft_tokens=3)
    assert spec[0][len(ids) :] == theirs
    # text: the end token is not shown; ignore_eos goes on to the length asked
    text = model.generate(PROMPT, 40, temperature=0)
    assert text == model.tokenizer.decode(theirs[:-1])
    assert model.generate([PROMPT, PROMPT], 40, temperature=0) == [text, text]
    streamed = []
    assert model.generate(PROMPT, 40, temperature=0, stream=streamed.append) == text == "".join(streamed)
    longer = model.generate(PROMPT, 12, temperature=0, ignore_eos=True)
    assert longer == model.tokenizer.decode(checkpoint["free"])  # (transformers' 12 tokens without an end)


def test_several_end_ids_stop_each_row_and_fill_it_with_the_first(checkpoint):
    model = attnlab.load(checkpoint["path"])
    ids = model.tokenizer.encode(PROMPT)
    k, ends = checkpoint["stop_at"], checkpoint["ends"]
    rows = generate(model, [ids, ids[:2]], 10, temperature=0.0, eos_id=ends)
    first, second = rows[0][len(ids) :], rows[1][2:]
    assert first[:k] == checkpoint["free"][:k] and set(first[k:]) == {ends[0]} and len(first) == len(second)
    assert any(t in ends for t in second) or len(second) == 10  # (generation stops once every row has ended)
    texts = generate_text(model, model.tokenizer, [PROMPT, PROMPT[:5]], 10, temperature=0.0, eos_id=ends)
    assert texts[0] == model.tokenizer.decode(checkpoint["free"][:k])


def test_the_chat_prompt_is_apply_chat_templates_ids_and_the_reply_ends_at_the_turns_end(checkpoint):
    model = attnlab.load(checkpoint["path"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "To be?"}]
    expected = checkpoint["tok"].apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"]) if hasattr(expected, "keys") else list(expected)
    assert model.chat_ids(messages) == expected
    reply = model.chat(messages, 40)  # (greedy: the checkpoint's generation_config does not sample)
    theirs = hf_greedy(checkpoint, expected)
    if theirs[-1] in checkpoint["ends"]:
        theirs = theirs[:-1]
    assert reply == model.tokenizer.decode(theirs)


def test_a_richer_template_renders_as_transformers_does(checkpoint):
    tok = checkpoint["tok"]
    tok2 = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer_object(), eos_token="<|im_end|>",
                                                bos_token="<|endoftext|>", chat_template=RICH)  # fmt: skip
    ours = ChatTemplate(RICH, {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    chats = [
        [{"role": "user", "content": "  hé, 'quoted' <b>  "}],
        [{"role": "system", "content": "S"}]
        + [{"role": r, "content": f"{i}"} for i, r in zip(range(8), ["user", "assistant"] * 4)],  # fmt: skip
    ]
    for chat in chats:
        for gen in (True, False):
            assert ours.render(chat, add_generation_prompt=gen) == tok2.apply_chat_template(
                chat, add_generation_prompt=gen, tokenize=False
            )
    tools = [{"name": "f", "description": "ünïcode"}]
    assert ours.render(chats[0], tools=tools) == tok2.apply_chat_template(chats[0], tools=tools, tokenize=False,
                                                                           add_generation_prompt=True)  # fmt: skip
    assert tok.chat_template == CHATML


@pytest.mark.parametrize(
    "messages, says",
    [
        ("hello", "must be a non-empty list"),
        ([], "an empty list"),
        (["hi"], "message 0 must be"),
        ([{"role": "wizard", "content": "hi"}], "role 'wizard'; a role is one of"),
        ([{"role": "user", "content": 3}], "needs its content as text"),
        ([{"role": "tool", "content": "x"}], "refuses these messages: no tools here"),
    ],
)
def test_a_bad_conversation_is_one_line(messages, says):
    template = ChatTemplate(RICH, {"bos_token": "<s>"})
    with pytest.raises(OptionError, match=says):
        template.render(messages)


def test_a_template_that_is_not_jinja_is_refused_when_read():
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        ChatTemplate("{% for m in messages %}")


def test_a_template_cannot_reach_python_internals():
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        ChatTemplate(evil).render([{"role": "user", "content": "x"}])


def test_a_model_without_a_template_says_so_and_points_to_sample(tmp_path, checkpoint):
    import shutil

    d = tmp_path / "plain"
    shutil.copytree(checkpoint["path"], d)
    (d / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    model = attnlab.load(d)
    with pytest.raises(OptionError, match="has no chat template.*attnlab sample"):
        model.chat([{"role": "user", "content": "hi"}])


def test_the_settings_survive_a_run_from_the_checkpoint_and_an_export(checkpoint, tmp_path):
    model = attnlab.load(checkpoint["path"])
    export_hf(model, tmp_path / "out")
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    messages = [{"role": "user", "content": "To be?"}]
    ids = back.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    assert ids == model.chat_ids(messages)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert list(again.generation_config.eos_token_id) == checkpoint["ends"]
    reread = attnlab.load(tmp_path / "out")
    assert reread.eos_ids == model.eos_ids and reread.chat_template.source == CHATML
    # a run that starts from it keeps them (in its config.json) and chats with the template
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    run = attnlab.train("gpt", data=str(corpus), init=str(checkpoint["path"]), out=tmp_path / "run", max_iters=2,
                        batch_size=2, context=32, eval_interval=2, eval_iters=1, progress=False)  # fmt: skip
    tuned = attnlab.load(tmp_path / "run")
    assert tuned.eos_ids == model.eos_ids and tuned.chat_template.source == CHATML
    assert isinstance(tuned.chat(messages, 5), str)
    del run


def test_attnlab_chat_answers_one_message_and_a_conversation_from_stdin(checkpoint, capsys, monkeypatch):
    import io

    from attnlab.cli import main

    model = attnlab.load(checkpoint["path"])
    first = model.chat([{"role": "user", "content": "To be?"}], 20)
    assert main(["chat", "--ckpt", str(checkpoint["path"]), "--message", "To be?", "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out == first + "\n"
    # a conversation: the second turn reads the first; /reset starts over (the same reply again)
    second = model.chat([{"role": "user", "content": "To be?"}, {"role": "assistant", "content": first},
                         {"role": "user", "content": "Or not?"}], 20)  # fmt: skip
    monkeypatch.setattr("sys.stdin", io.StringIO("To be?\nOr not?\n/reset\n\nTo be?\n/exit\nnever read\n"))
    assert main(["chat", "--ckpt", str(checkpoint["path"]), "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out == f"{first}\n{second}\n{first}\n"


def test_attnlab_sample_stops_at_the_end_token_unless_told_not_to(checkpoint, capsys):
    from attnlab.cli import main

    model = attnlab.load(checkpoint["path"])
    args = ["sample", "--ckpt", str(checkpoint["path"]), "--prompt", PROMPT, "--temperature", "0"]
    assert main([*args, "--max-new-tokens", "40"]) == 0
    assert (
        capsys.readouterr().out == PROMPT + model.tokenizer.decode(checkpoint["free"][: checkpoint["stop_at"]]) + "\n"
    )
    assert main([*args, "--max-new-tokens", "12", "--ignore-eos"]) == 0
    assert capsys.readouterr().out == PROMPT + model.tokenizer.decode(checkpoint["free"]) + "\n"


def test_attnlab_chat_on_a_model_without_a_template_is_one_line(tmp_path, capsys):
    from attnlab.cli import main

    run = tmp_path / "run"
    attnlab.train("gpt", out=run, max_iters=1, layers=1, heads=1, dim=8, context=16, batch_size=2, eval_iters=1,
                  progress=False)  # fmt: skip
    capsys.readouterr()
    assert main(["chat", "--ckpt", str(run), "--message", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no chat template" in err and "attnlab sample" in err


@pytest.fixture(scope="module")
def served(checkpoint):
    """``attnlab serve`` of the checkpoint on a free port."""
    import threading

    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from attnlab import serve as serving

    model = attnlab.load(checkpoint["path"])
    started, box = threading.Event(), {}

    def ready(s):
        box["server"] = s
        started.set()

    thread = threading.Thread(target=serving.serve, args=(model,), kwargs={"port": 0, "ready": ready}, daemon=True)
    thread.start()
    assert started.wait(20)
    yield model, f"http://127.0.0.1:{box['server'].server_address[1]}"
    box["server"].shutdown()
    thread.join(10)


def test_the_official_openai_client_chats_streamed_and_not(served, checkpoint):
    openai = pytest.importorskip("openai")
    model, url = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "To be?"}]
    want = model.chat(messages, 30)  # (the checkpoint's generation_config: greedy)
    r = client.chat.completions.create(model="qwen", messages=messages, max_tokens=30)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(model.chat_ids(messages))
    pieces, reasons = [], []
    for event in client.chat.completions.create(model="qwen", messages=messages, max_tokens=30, stream=True):
        pieces.append(event.choices[0].delta.content or "")
        reasons.append(event.choices[0].finish_reason)
    assert "".join(pieces) == want and reasons[-1] == r.choices[0].finish_reason and set(reasons[:-1]) == {None}
    # a text completion that reaches the end token: stops there, says "stop", shows no end token
    c = client.completions.create(model="qwen", prompt=PROMPT, max_tokens=40, temperature=0)
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].text == model.tokenizer.decode(checkpoint["free"][: checkpoint["stop_at"]])
    c = client.completions.create(model="qwen", prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    assert c.choices[0].finish_reason == "length" and c.choices[0].text == model.tokenizer.decode(checkpoint["free"])


def test_prompt_logprobs_are_transformers_log_softmax_and_its_top_tokens(served, checkpoint):
    httpx = pytest.importorskip("httpx")
    model, url = served
    ids = model.tokenizer.encode(PROMPT + " that is the question")

    def text_of(i):  # (a piece of a character's bytes: its vocabulary string, as transformers names it)
        text = checkpoint["tok"].decode([i])
        return checkpoint["tok"].convert_ids_to_tokens(i) if "\ufffd" in text else text

    with torch.no_grad():
        theirs = checkpoint["hf"](torch.tensor([ids])).logits[0].float().log_softmax(-1)
    with httpx.Client(base_url=url, timeout=60) as c:
        for prompt in (PROMPT + " that is the question", ids):
            body = {"prompt": prompt, "echo": True, "logprobs": 5, "max_tokens": 0}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            lp = r.json()["choices"][0]["logprobs"]
            assert r.json()["choices"][0]["text"] == PROMPT + " that is the question"
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            assert lp["tokens"] == [text_of(i) for i in ids]
            want = theirs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            assert torch.allclose(torch.tensor(lp["token_logprobs"][1:]), want, atol=1e-4)
            for j in range(1, len(ids)):
                top = theirs[j - 1].topk(5)
                got = lp["top_logprobs"][j]
                assert [text_of(i) for i in top.indices.tolist()] == list(got)
                assert torch.allclose(torch.tensor(list(got.values())), top.values, atol=1e-4)
            text = r.json()["choices"][0]["text"]
            assert [text[o:] for o in lp["text_offset"]][1].startswith(lp["tokens"][1])
        # the completion's own tokens, with n choices, as lm-evaluation-harness asks (echo, 1 new token)
        r = c.post("/v1/completions", json={"prompt": [ids, ids[:4]], "echo": True, "logprobs": 1, "max_tokens": 1,
                                            "temperature": 0, "n": 2})  # fmt: skip
        choices = r.json()["choices"]
        assert len(choices) == 4 and choices[0]["text"] == choices[1]["text"]
        lp = choices[0]["logprobs"]
        assert len(lp["tokens"]) == len(ids) + 1 and torch.allclose(
            torch.tensor(lp["token_logprobs"][1 : len(ids)]), want, atol=1e-4
        )
        assert lp["token_logprobs"][-1] == pytest.approx(max(lp["top_logprobs"][-1].values()), abs=1e-6)  # (greedy)
        # /tokenize and /detokenize, as vLLM answers them
        t = c.post("/tokenize", json={"prompt": PROMPT}).json()
        assert t["tokens"] == model.tokenizer.encode(PROMPT) and t["count"] == len(t["tokens"])
        assert t["max_model_len"] == model.config.context
        chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": "To be?"}]}).json()
        assert chat["tokens"] == model.chat_ids([{"role": "user", "content": "To be?"}])
        assert c.post("/detokenize", json={"tokens": t["tokens"]}).json() == {"prompt": PROMPT}


@pytest.mark.parametrize(
    "path, body, says",
    [
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "role 'wizard'"),
        ("/v1/chat/completions", {"messages": "hi"}, "'messages' must be a list"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text parts"),
        ("/v1/chat/completions", {"messages": []}, "non-empty list"),
        ("/v1/completions", {"prompt": "to", "logprobs": 50}, "must be at most 20"),
        ("/v1/completions", {"prompt": [3, 100000], "max_tokens": 1}, "outside the vocabulary"),
        ("/v1/completions", {"prompt": "to", "n": 1000}, "must be at most 16"),
        ("/detokenize", {"tokens": [100000]}, "outside the vocabulary"),
        ("/tokenize", {}, "give 'prompt' (text) or 'messages'"),
    ],
)
def test_a_bad_request_is_one_line_in_openais_shape(served, path, body, says):
    httpx = pytest.importorskip("httpx")
    _, url = served
    r = httpx.post(url + path, json=body, timeout=30)
    message = r.json()["error"]["message"] if path.startswith("/v1/") else r.text
    assert r.status_code == 400 and says in message and "\n" not in message.strip(), r.text


LM_EVAL_DATA = __import__("pathlib").Path(__file__).parent / "fixtures" / "lm_eval"
MC_TASK = """task: attnlab_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/shakespeare_mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""
GEN_TASK = """task: attnlab_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/shakespeare_gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.mark.slow
def test_lm_evaluation_harness_scores_a_served_model_as_transformers_does(served, checkpoint, tmp_path, monkeypatch):
    """lm-evaluation-harness against `attnlab serve`, offline: a multiple-choice task through
    local-completions (each choice's log-likelihood from echo + logprobs, the tokenizer read through
    /tokenize), equal to transformers' on the same checkpoint; a generation task through
    local-chat-completions, equal to model.chat."""
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    (tmp_path / "mc.yaml").write_text(MC_TASK.format(data=LM_EVAL_DATA))
    (tmp_path / "gen.yaml").write_text(GEN_TASK.format(data=LM_EVAL_DATA))
    model, url = served
    tasks = TaskManager(include_path=str(tmp_path))
    out = simple_evaluate(
        model="local-completions",
        model_args=f"base_url={url}/v1/completions,model=qwen,tokenizer_backend=remote,max_length=256,max_retries=1",
        tasks=["attnlab_mc"], task_manager=tasks, log_samples=True, random_seed=0, numpy_random_seed=0,
        torch_random_seed=0, fewshot_random_seed=0,
    )  # fmt: skip
    tok, hf = checkpoint["tok"], checkpoint["hf"]
    scored = 0
    for sample in out["samples"]["attnlab_mc"]:
        arguments = sample["arguments"]
        for pair, resp in zip(arguments.values() if isinstance(arguments, dict) else arguments, sample["resps"]):
            context, continuation = pair.values() if isinstance(pair, dict) else pair
            whole = tok(context + continuation)["input_ids"]
            ctx = tok(context)["input_ids"]
            with torch.no_grad():
                logp = hf(torch.tensor([whole])).logits[0].float().log_softmax(-1)
            want = sum(float(logp[j - 1, whole[j]]) for j in range(len(ctx), len(whole)))
            assert resp[0][0] == pytest.approx(want, abs=1e-4)
            scored += 1
    assert scored == 18 and 0 <= out["results"]["attnlab_mc"]["acc,none"] <= 1
    chat = simple_evaluate(
        model="local-chat-completions", model_args=f"base_url={url}/v1/chat/completions,model=qwen,max_retries=1",
        tasks=["attnlab_gen"], task_manager=tasks, log_samples=True, apply_chat_template=True,
    )  # fmt: skip
    for sample in chat["samples"]["attnlab_gen"]:
        question = sample["doc"]["question"]
        want = model.chat([{"role": "user", "content": question}], 8, temperature=0, stop=["."])
        assert sample["resps"][0][0] == want


GENERATION_TAGS = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}"
    "{{ m['content'] + '<|im_end|>\\n' }}{% endgeneration %}{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + "
    "m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "To be?"},
    {"role": "assistant", "content": "Or not to be."},
    {"role": "user", "content": "Whether 'tis nobler"},
    {"role": "assistant", "content": "in the mind."},
]


def test_the_loss_mask_is_the_assistants_tokens_as_transformers_marks_them():
    """On a hand-made conversation: the tokens chat fine-tuning learns are exactly those
    transformers' return_assistant_tokens_mask marks ({% generation %} blocks), and the same ids."""
    from attnlab.tokens import BPETokenizer

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer_object(), chat_template=GENERATION_TAGS)
    theirs = tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ours = BPETokenizer(tokenizer_object())
    ids, mask = ChatTemplate(GENERATION_TAGS).assistant_tokens(CONVERSATION, ours)
    assert ids == list(theirs["input_ids"]) and [int(m) for m in mask] == list(theirs["assistant_masks"])
    learned = ours.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "Or not to be.<|im_end|>\nin the mind.<|im_end|>\n"
    with pytest.raises(OptionError, match="needs at least one assistant message"):
        ChatTemplate(GENERATION_TAGS).assistant_tokens(CONVERSATION[:2], ours)


def test_a_chat_fine_tuning_run_learns_the_assistants_turns_and_chats(checkpoint, tmp_path, capsys):
    from attnlab.cli import main

    lines = []
    for i in range(12):
        q = ["To be?", "Or not?", "Whether?", "Nobler?"][i % 4]
        a = ["To be.", "Not to be.", "Whether 'tis.", "In the mind."][i % 4]
        lines.append(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}))
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    args = ["train", "gpt", "--init", str(checkpoint["path"]), "--task", "chat", "--data", str(data), "--out", str(run),
            "--max-iters", "40", "--batch-size", "4", "--lr", "3e-3", "--eval-interval", "40", "--eval-iters", "1",
            "--warmup-iters", "0", "--no-progress"]  # fmt: skip
    before = attnlab.load(checkpoint["path"])
    from attnlab.data.chat import chat_data
    from attnlab.training.tasks import ChatTask

    task = ChatTask(chat_data(data, before.chat_template, before.tokenizer, 256), 256, 4)
    loss_before = task.evaluate(before, "train")["loss"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "11 train / 1 val conversations" in out.err
    tuned = attnlab.load(run)
    assert tuned.run_meta["task"] == "chat" and tuned.chat_template.source == CHATML
    assert task.evaluate(tuned, "train")["loss"] < 0.5 * loss_before
    assert tuned.chat([{"role": "user", "content": "To be?"}], 8, temperature=0) == "To be."
    assert main(["eval", "--ckpt", str(run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["split"] == "val" and res["conversations"] == 1 and res["assistant_tokens"] > 0
    export_hf(tuned, tmp_path / "hf")
    assert (tmp_path / "hf" / "chat_template.jinja").read_text() == CHATML


@pytest.mark.parametrize(
    "content, says",
    [
        ("not json\n{}\n", "chat.jsonl:1: not JSON"),
        ('{"messages": [{"role": "user", "content": "x"}]}\n', "holds 1 conversation"),
        ('{"messages": [{"role": "user", "content": "x"}]}\n{"messages": "x"}\n', "chat.jsonl:2: a line is"),
        (
            '{"messages": [{"role": "user", "content": "x"}]}\n' * 2,
            "conversation 1: a conversation to learn from needs",
        ),
    ],
)
def test_bad_chat_data_is_one_line(checkpoint, tmp_path, content, says):
    data = tmp_path / "chat.jsonl"
    data.write_text(content)
    with pytest.raises(Exception, match=says.replace("(", r"\(")):
        attnlab.train("gpt", init=str(checkpoint["path"]), task="chat", data=str(data), out=tmp_path / "run",
                      max_iters=1, progress=False)  # fmt: skip


def test_chat_fine_tuning_needs_a_model_with_a_template(tmp_path):
    with pytest.raises(Exception, match="--task chat fine-tunes a model that has a chat template"):
        attnlab.train("gpt", task="chat", out=tmp_path / "run", max_iters=1, progress=False)


def test_a_conversation_past_the_context_keeps_going_without_its_oldest_exchanges(checkpoint, capsys, monkeypatch):
    """Interactive `attnlab chat` exited (code 2) once the conversation filled the context, with
    "drop earlier messages" and no way to (issue 81): its oldest exchanges are dropped, the
    system message kept, with a one-line notice, and every message is answered."""
    import functools
    import io

    from attnlab.cli import main

    model = attnlab.load(checkpoint["path"])
    lines = [f"Message {i}: " + "to be or not to be, that is the question " * 2 for i in range(8)]
    assert len(model.tokenizer.encode("".join(lines))) > model.config.context
    from attnlab.recipes.gpt import GPTVerbs

    asked, chat = [], GPTVerbs.chat

    @functools.wraps(chat)  # (its signature declares the command's options)
    def counted(self, messages, **kw):
        asked.append(list(messages))
        return chat(self, messages, **kw)

    monkeypatch.setattr(GPTVerbs, "chat", counted)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    args = ["chat", "--ckpt", str(checkpoint["path"]), "--system", "Be brief.", "--max-new-tokens", "8"]
    assert main([*args, "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    notices = err.count("warning: the conversation filled the model's context: its oldest exchange was dropped\n")
    assert notices >= 1 and err.count("\n") == notices  # (nothing else said)
    assert [m[-1]["content"] for m in asked] == lines  # every message answered, each with the system message first
    assert all(m[0] == {"role": "system", "content": "Be brief."} for m in asked) and len(asked[-1]) < 2 * len(lines)
