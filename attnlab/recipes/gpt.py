"""GPT language models: `attnlab train gpt`, `attnlab sample`, and `eval` (loss, perplexity, bits)."""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, Sequence

from ..models.configs import GPT_PRESETS, GPTConfig
from . import register
from .base import (
    TINY_RUN,
    Attribution,
    ModelKind,
    TrainOptions,
    TextInspection,
    Recipe,
    TrainingRun,
    Verbs,
    Evaluation,
)
from ..errors import Note, OptionError, UnknownTokenError, a
from ..options import (
    ATTRIBUTION_METHOD,
    ATTRIBUTION_STEPS,
    AttributionMethod,
    AttributionSteps,
    PatchOver,
    Arg,
    checked,
    DecodeDtype,
    Device,
    Quantize,
    MAX_COUNT,
    QUANTIZE_HELP,
    QuantizeChoice,
    Command,
    named,
    number,
    count_argument,
    new_tokens,
    seed_value,
    vocab_size,
    nonneg_float,
    nonneg_int,
    positive_int,
    probability,
)
from ..tokens.ids import checked_token_ids

if TYPE_CHECKING:
    from ..interop.generation import GenerationSettings


class GPTVerbs(Verbs):
    """A GPT loaded by :func:`attnlab.load`: ``tokenizer``, ``generate``, ``patch``, ``logit_lens``,
    ``attribute``."""

    _generation: GenerationSettings | None = None

    @property
    def generation(self) -> GenerationSettings:
        """End-of-sequence ids, sampling defaults, chat template (read by ``attach``; none for a
        model built in Python)."""
        if self._generation is None:
            from ..interop.generation import GenerationSettings

            return GenerationSettings()
        return self._generation

    @generation.setter
    def generation(self, settings: GenerationSettings) -> None:
        self._generation = settings

    def require_tokenizer(self):
        """The model's tokenizer, or the one-line error that says what its folder lacks (a
        HuggingFace folder may hold the weights alone: the model still runs on token ids)."""
        if self.tokenizer is None:
            lm_tokenizer({}, self.checkpoint)  # (raises, naming what is missing)
        return self.tokenizer

    def token_ids(self, text: str, what: str = "text"):
        """``text`` as a batch of one (1, T) of token ids, refused in one line (naming it ``what``)
        when empty, not encodable or longer than the context."""
        import torch

        if not isinstance(text, str) or not text:
            raise OptionError(f"{what} must be a non-empty text")
        ids = self.require_tokenizer().encode(text)
        if len(ids) > self.config.context:
            raise OptionError(f"{what} is {len(ids)} tokens, more than the model's context of {self.config.context}")
        return torch.tensor([ids], device=self.device)

    def to_str_tokens(self, text) -> list[str]:
        """TransformerLens's ``to_str_tokens``: ``text`` (or token ids: a list, or a (T,) / (1, T)
        tensor) as the string of each of its tokens."""
        self.require_tokenizer()
        import torch

        ids = self.token_ids(text, "text")[0].tolist() if isinstance(text, str) else text
        if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.dtype != torch.bool:
            ids = ids.reshape(-1).tolist()
        if (
            not isinstance(ids, (list, tuple))
            or not ids
            or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
        ):
            raise OptionError(
                f"to_str_tokens takes text, or token ids (a list of integers or an integer tensor); got {text!r:.40}"
            )
        vocab = self.config.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise OptionError(f"token ids from {min(ids)} to {max(ids)}: this model's ids run from 0 to {vocab - 1}")
        return [self.tokenizer.decode([int(i)]) for i in ids]

    def one_token(self, text: str, what: str) -> int:
        """The id of ``text``, which must be a single token (an answer), else a one-line error."""
        ids = self.tokenizer.encode(text) if isinstance(text, str) and text else []
        if len(ids) != 1:
            raise OptionError(f"{what} {text!r} is {len(ids)} tokens; give a single token (for this tokenizer)")
        return ids[0]

    @checked
    def patch(self, clean: str, corrupt: str, answer: str, wrong: str | None = None, *, over: PatchOver = "resid_pre"):
        """Activation patching (:mod:`attnlab.inspect.patching`): how much of the clean text's
        preference for ``answer`` (over ``wrong``, or its log-probability) each layer x position
        (``over="resid_pre"``, or any target of :data:`attnlab.inspect.patching.PATCH_TARGETS`:
        ``"head"``, ``"attn_out"``, ``"q"`` …) restores in the corrupted run. Returns
        {"restored": (L, T or H) tensor, "tokens": the clean tokens (positions only), "over",
        "clean", "corrupt", "span"}."""
        from ..inspect.patching import by_position, logit_difference, patch_activations, patching_span

        x, y = self.token_ids(clean, "clean"), self.token_ids(corrupt, "corrupt")
        if x.shape != y.shape:
            raise OptionError(
                f"the clean text is {x.shape[1]} tokens and the corrupted one {y.shape[1]}; patching needs the "
                "same number (change a word for one of the same length)"
            )
        metric = logit_difference(
            self.one_token(answer, "answer"), None if wrong is None else self.one_token(wrong, "wrong")
        )
        restored = patch_activations(self, (x,), (y,), metric, over=over)
        tokens = [self.tokenizer.decode([i]) for i in x[0].tolist()] if by_position(over) else None
        return {"restored": restored, "tokens": tokens, "over": over, **patching_span(self, (x,), (y,), metric)}

    @checked
    def attribute(
        self,
        text: str,
        answer: str,
        *,
        method: AttributionMethod = ATTRIBUTION_METHOD,
        steps: AttributionSteps = ATTRIBUTION_STEPS,
        baseline: str | None = None,
        internal_batch_size: int | None = None,
    ):
        """How much each token of ``text`` contributes to the logit of the next token ``answer``
        (:mod:`attnlab.inspect.attribution`): [(token, score), ...], scores summing to the logit's
        rise over the baseline (integrated gradients): zero embeddings, or ``baseline`` (one token's
        text, e.g. " ") at every position. ``internal_batch_size``: path points run at once."""
        from ..inspect.attribution import text_attributions

        idx = self.token_ids(text, "text")
        base = None if baseline in (None, "zeros") else self.one_token(baseline, "baseline")
        res = text_attributions(
            self,
            idx,
            self.one_token(answer, "answer"),
            method=method,
            steps=steps,
            baseline=base,
            internal_batch_size=internal_batch_size,
        )
        return [(self.tokenizer.decode([i]), float(s)) for i, s in zip(idx[0].tolist(), res["tokens"][0])]

    def logit_lens(self, text: str, top_k: int = 1) -> dict:
        """Every layer's top next-token guesses at every position (:func:`attnlab.inspect.lens.logit_lens`)."""
        from ..inspect.lens import logit_lens_table

        self.token_ids(text, "text")
        count_argument(top_k, "top_k")
        return logit_lens_table(self, self.tokenizer, text, top_k)

    def attach(self, meta: dict) -> None:
        from ..errors import CheckpointError
        from ..interop.generation import GenerationSettings, read_generation

        try:  # a HuggingFace folder may hold the weights alone: the model still runs on token ids
            self.tokenizer = lm_tokenizer(meta, self.checkpoint)
        except CheckpointError:
            self.tokenizer = None
        tokenizer_that_fits(self.tokenizer, self.config.vocab_size, self.checkpoint)
        # end-of-sequence ids, sampling defaults, chat template: a HuggingFace folder's files, or
        # what a run that started from one (--init) kept in its config.json
        if meta.get("model_type") is None and meta.get("format") != "gguf":
            self.generation = read_generation(self.checkpoint)
        else:
            self.generation = GenerationSettings.from_dict(meta.get("generation"))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The tokens that end a generation (the checkpoint's end-of-sequence ids; none for a model
        trained on plain text, which runs to its length)."""
        return self.generation.eos_ids

    @property
    def chat_template(self):
        """The checkpoint's chat template (:class:`attnlab.tokens.chat.ChatTemplate`), or None."""
        return self.generation.chat_template

    def require_chat_template(self):
        """The chat template, or the one-line error that says the model has none and what to do."""
        if self.chat_template is None:
            raise OptionError(
                f"{getattr(self, 'checkpoint', 'this model')} has no chat template (no chat_template.jinja, none in "
                "tokenizer_config.json): it continues text; use attnlab sample (model.generate) instead"
            )
        return self.chat_template

    def corpus_ids(self, split: str = "train", data: str | None = None, data_dir: str | None = None):
        """(the corpus's name, the token ids of its ``split`` as a 1-D array): the run's own data,
        or ``data`` encoded with this model's tokenizer (what ``evaluate`` and SAEs read)."""
        return corpus_ids(self.checkpoint, self.run_meta, self.require_tokenizer(), split, data, data_dir)

    @checked
    def generate(
        self,
        prompt: str | list[str] | list[int] = "",
        max_new_tokens: Annotated[int, Arg("tokens to generate per sample", new_tokens)] = 200,
        *,
        temperature: Annotated[float, Arg("softmax temperature; 0 = greedy", nonneg_float)] = 0.8,
        top_k: Annotated[int | None, Arg("sample only from the k most likely tokens (0 = off)", nonneg_int)] = 200,
        top_p: Annotated[
            float | None, Arg("nucleus sampling: smallest set with this total probability", probability)
        ] = None,
        stop: Annotated[Sequence[str], Arg("stop a sample at this string (repeatable)")] = (),
        seed: Annotated[int | None, Arg("random seed (sample i of a command draws with seed + i)", seed_value)] = None,
        use_cache: Annotated[
            bool, Arg("the KV cache (--no-cache: recompute the whole prefix each step)", flags=("--cache",))
        ] = True,
        draft=None,
        draft_tokens: Annotated[int, Arg("tokens the draft proposes per check", positive_int)] = 4,
        batch_size: Annotated[
            int,
            Arg(
                "prompts generated together (a list of prompts, --prompts-file); a finished one's row goes to the next",
                number(int, 1, True, MAX_COUNT, what=f"from 1 to {MAX_COUNT:,}"),
            ),
        ] = 8,
        compile: Annotated[
            bool,
            Arg(
                "decode with a fixed-shape step compiled once (CUDA graphs on a GPU): the same tokens, far fewer kernel "
                "launches per token; pays off for long samples (learned, sinusoidal or rope positions)"
            ),
        ] = False,
        quantize: Quantize = None,
        ignore_eos: Annotated[
            bool, Arg("go on past the checkpoint's end-of-sequence token (by default a sample ends there)")
        ] = False,
        stream: Callable[[str], None] | None = None,
    ) -> str | list[str]:
        """The continuation of ``prompt`` (text, or its token ids; empty: start a new line), as ``attnlab sample``
        writes it; it ends at the checkpoint's end-of-sequence token (:attr:`eos_ids`, not shown)
        unless ``ignore_eos``. ``temperature=0`` is greedy; ``seed`` makes sampling repeatable. ``draft``: a
        smaller GPT with the same tokenizer (a loaded model or its run folder) that proposes
        ``draft_tokens`` tokens for this one to check at once (speculative decoding: the same
        distribution, fewer reads of this model's weights).

        A list of prompts gives a list of continuations, generated ``batch_size`` at a time by
        continuous batching (:class:`attnlab.generate.batching.ContinuousBatcher`: a prompt takes the row of
        one that finished); prompt i draws with seed ``seed + i``, so its text does not depend on
        the others. Each prompt and its ``max_new_tokens`` must then fit the model's context.
        ``compile=True``: one prompt decodes through a fixed-shape step compiled once
        (:mod:`attnlab.generate.fast`; CUDA graphs on a GPU), with the same tokens. ``quantize``
        (int8, dynamic-int8, packed; on the CPU): decode with a copy of this model whose Linear layers
        are so, as ``attnlab sample --quantize`` does (for many calls, quantize the model once with
        :func:`attnlab.generate.quantize.quantize`). ``stream``: called
        with each piece of new text as it is generated (one prompt; what ``attnlab sample`` prints),
        or, for a list of prompts, with (i, continuation of prompt i) as each one finishes."""
        import torch

        from ..generate import default_prompt, generate_text
        from ..generate.batching import generate_texts

        ids = isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(_is_id(i) for i in prompt)
        many = isinstance(prompt, (list, tuple)) and not ids
        eos = None if ignore_eos else (self.eos_ids or None)
        needed = dict(max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size,
                      draft_tokens=draft_tokens, stop=stop)  # fmt: skip
        _check_generate_call(prompt, needed, use_cache, vocab=None if not ids else self.config.vocab_size)
        self.require_tokenizer()
        from ..training.memory import check_cache_fits

        check_cache_fits(self, min(batch_size, len(prompt)) if many else 1)
        model = self
        if quantize is not None:  # (on a copy: this model in memory stays as it is)
            from ..generate.quantize import quantized_copy

            if self.device.type != "cpu":
                raise OptionError(f"quantize={quantize!r} runs on the CPU; move the model there with model.to('cpu')")
            model = quantized_copy(self, quantize)
        if many:
            if draft is not None or not use_cache or compile:
                raise OptionError(
                    "a list of prompts is batched with the KV cache, row by row: drop draft=, use_cache=False and "
                    "compile=True"
                )
            sampling = dict(temperature=temperature, top_k=top_k or None, top_p=top_p, eos_id=eos)
            return generate_texts(
                model,
                self.tokenizer,
                prompt,
                max_new_tokens,
                slots=batch_size,
                stop=stop,
                seed=seed,
                on_done=stream,
                **sampling,
            )
        if compile:  # (layers the compiler cannot trace: decoded eager, said, not a compiler's traceback)
            from ..generate.quantize import compiles

            compile = compiles(model, compile)
        text = list(prompt) if ids else prompt or default_prompt(self.tokenizer)
        n = len(text) if ids else len(self.tokenizer.encode(text))  # (unknown characters fail here, clearly)
        if n > self.config.context:  # (the window slides: the model reads the prompt's last tokens only)
            c = self.config.context
            warnings.warn(
                f"the prompt is {n} tokens, more than the model's context of {c}: it reads the last {c}", Note
            )
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
        with torch.no_grad():
            return generate_text(
                model,
                self.tokenizer,
                text,
                max_new_tokens,
                temperature=temperature,
                top_k=top_k or None,
                top_p=top_p,
                use_cache=use_cache,
                generator=gen,
                stop=list(stop),
                compile=bool(compile),
                stream=stream,
                eos_id=eos,
                **self.draft_options(draft, draft_tokens),
            )[0]

    @checked
    def chat(
        self,
        messages: list[dict],
        max_new_tokens: Annotated[int, Arg("most tokens in a reply", new_tokens)] = 512,
        *,
        temperature: Annotated[
            float | None,
            Arg(
                "softmax temperature; 0 = greedy (default: the checkpoint's generation_config.json, else greedy)",
                nonneg_float,
            ),
        ] = None,
        top_k: Annotated[int | None, Arg("sample only from the k most likely tokens (0 = off)", nonneg_int)] = None,
        top_p: Annotated[
            float | None, Arg("nucleus sampling: smallest set with this total probability", probability)
        ] = None,
        stop: Annotated[Sequence[str], Arg("end the reply at this string (repeatable)")] = (),
        seed: Annotated[int | None, Arg("random seed", seed_value)] = None,
        ignore_eos: Annotated[bool, Arg("go on past the end of the assistant's turn")] = False,
        stream: Callable[[str], None] | None = None,
        **template_variables: Any,
    ) -> str:
        """The assistant's reply to ``messages`` (``[{"role": "system" | "user" | "assistant",
        "content": text}, ...]``), with the checkpoint's chat template as ``transformers``'
        ``apply_chat_template(..., add_generation_prompt=True)`` renders it; it ends where the
        model ends its turn (its end-of-sequence ids, not shown). Sampling settings left out are the
        checkpoint's (generation_config.json: greedy unless it says ``do_sample``).
        ``template_variables``: what the template reads besides (``enable_thinking=False`` …).
        ``stream``: called with each piece of the reply as it is generated."""
        ids = self.chat_ids(messages, **template_variables)
        sampling = self.chat_sampling(temperature, top_k, top_p)
        return self.generate(
            ids,
            max_new_tokens,
            temperature=sampling["temperature"],
            top_k=sampling["top_k"] or 0,  # (0: off)
            top_p=sampling["top_p"],
            stop=stop,
            seed=seed,
            ignore_eos=ignore_eos,
            stream=stream,
        )

    def chat_sampling(self, temperature=None, top_k=None, top_p=None, *, otherwise: float = 0.0) -> dict:
        """A chat turn's sampling: each setting given (not None), else the checkpoint's
        generation_config.json, else no filtering at temperature ``otherwise`` (greedy, as
        ``transformers``; OpenAI's clients expect 1). What ``chat`` and the server's chat endpoint use."""
        given = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        chosen = {**self.generation.sampling, **{k: v for k, v in given.items() if v is not None}}
        return {"temperature": chosen.get("temperature", otherwise), "top_k": chosen.get("top_k"),
                "top_p": chosen.get("top_p")}  # fmt: skip

    def chat_ids(self, messages: list[dict], *, add_generation_prompt: bool = True, **template_variables) -> list[int]:
        """The token ids of ``messages`` rendered with the chat template (what ``chat`` continues),
        refused in one line when they do not fit the model's context."""
        text = self.require_chat_template().render(
            messages, add_generation_prompt=add_generation_prompt, **template_variables
        )
        ids = self.require_tokenizer().encode(text)
        if len(ids) >= self.config.context:
            raise OptionError(
                f"the conversation is {len(ids)} tokens, which leaves no room in the model's context of "
                f"{self.config.context}; drop earlier messages"
            )
        return ids

    def draft_options(self, draft, draft_tokens: int) -> dict:
        """generate()'s keywords for a ``draft`` given as a loaded model or a run folder."""
        if draft is None:
            return {}
        import torch

        if not isinstance(draft, (str, Path, torch.nn.Module)):
            raise OptionError(f"draft= must be a loaded GPT or its run folder, got {type(draft).__name__}")
        draft = load_draft(draft, self.tokenizer, self.config.vocab_size, str(self.device))
        return {"draft": draft, "draft_tokens": draft_tokens}


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_generate_call(prompt, needed: dict, use_cache, vocab: int | None = None) -> None:
    """What ``generate``'s declaration does not check: the prompt's type (token ids within the
    vocabulary of ``vocab`` tokens), the options that have no 'off' (``needed``, given None),
    ``use_cache`` and empty ``stop`` strings (the `sample` command's declarations check the values
    given)."""
    many = isinstance(prompt, (list, tuple))
    if vocab is not None:
        try:
            checked_token_ids(prompt, vocab)
        except UnknownTokenError as e:
            raise OptionError(f"prompt {e}") from None
    elif many and not all(isinstance(p, str) for p in prompt):
        raise OptionError("prompt must be text, a list of texts or a list of token ids")
    elif not many and not isinstance(prompt, str):
        raise OptionError(f"prompt must be text, got {type(prompt).__name__}")
    for name, value in needed.items():
        if value is None:
            raise OptionError(f"{named(name, None)}: give a value ({name} has no 'off')")
    if not isinstance(use_cache, bool):
        raise OptionError(f"use_cache={use_cache!r}: must be True or False")
    if any(s == "" for s in needed["stop"]):
        raise OptionError(f"{named('stop', '')}: would stop before the first token; give non-empty strings")


@dataclass(frozen=True)
class GPTTrainOptions(TrainOptions):
    """The GPT family's own options of ``attnlab train gpt``: its text, tokenizer and start."""

    data: Annotated[
        str | None,
        Arg("text file, folder of text files, or a dataset name: python-docs (embedded, default), shakespeare"),
    ] = None
    tokenizer: Annotated[Literal["char", "bpe"] | None, Arg("character-level (default) or byte-level BPE")] = None
    init: Annotated[
        str | None,
        Arg(
            "fine-tune: start from this GPT (an attnlab run, a HuggingFace folder or hub name of a GPT-2, Llama, "
            "Qwen2/3, Mistral, Gemma 2/3, Phi-3 or GPT-NeoX model, or a GGUF file of a Llama, Mistral or Qwen2/3), "
            "keeping its shape and tokenizer; --context may shorten it, --dropout change"
        ),
    ] = None
    vocab_size: Annotated[int | None, Arg("BPE vocabulary size (default 1024)", vocab_size(2))] = None
    preset: Annotated[
        Literal[tuple(sorted(GPT_PRESETS))],  # type: ignore[valid-type]
        Arg(
            "model shape to start from (shakespeare-cpu: 4 layers, 4 heads, 128 wide, context 64); speedrun-cpu / "
            "speedrun: the same shapes with the modded-nanogpt speedrun's changes and Muon"
        ),
    ] = "shakespeare-cpu"
    task: Annotated[
        Literal["lm", "chat"],
        Arg(
            "lm: next-token prediction on text; chat: fine-tune an instruct model (--init, with a chat template) on "
            "conversations (--data FILE.jsonl, OpenAI's fine-tuning format), the loss on the assistant's tokens only"
        ),
    ] = "lm"
    sample_chars: Annotated[int, Arg("print a sample of this many tokens at the end (0: none)", nonneg_int)] = 0
    loss_chunk: Annotated[
        int,
        Arg(
            "compute the loss this many tokens at a time, each block's logits recomputed in the backward pass, so "
            "the (tokens x vocabulary) fp32 logits are never held at once: memory for large vocabularies, at the "
            "cost of a second pass through the output head (0: all at once)",
            nonneg_int,
        ),
    ] = 0


@dataclass(frozen=True)
class GPTInspection(TextInspection, Attribution):
    answer: Annotated[
        str | None,
        Arg("attribution, logit-attribution: the next token whose logit to explain (default: the model's guess)"),
    ] = None


@register
class GPTRecipe(Recipe):
    name = "gpt"
    help = "a GPT language model on any text"
    description = (
        "Train a decoder-only GPT to predict the next token of a text corpus. With no --data it trains "
        "on English text that ships with Python (no download needed)."
    )
    models = {"gpt": ModelKind(GPTConfig, "attnlab.models.gpt:GPT", GPTVerbs)}
    presets = GPT_PRESETS
    set_by_data = ("vocab_size",)
    explore_kind = "text"
    ablatable = True
    target_is_loss = True
    default_seconds = (60, 108)  # benchmarks/first_hour.py, 2026-12-07
    train_options = GPTTrainOptions
    inspect_options = GPTInspection
    inspections = {
        "attention": "every layer's and head's attention on --text: query tokens down, key tokens across",
        "lens": "the logit lens: each layer's top next-token guess and its probability at every position (--text)",
        "attribution": "how much each token of --text raises the logit of the next token --answer (--method)",
        "logit-attribution": "direct logit attribution: what each head and MLP writes toward --answer (--text)",
        "heads": "previous-token, duplicate-token and induction score of every head (--text, or random tokens twice)",
    }
    tiny = dict(
        TINY_RUN,
        preset="nano",
        context=16,
        sample_chars=0,
    )
    # Training recipe per preset, on top of TrainConfig's (nanoGPT's) defaults. shakespeare-cpu:
    # nanoGPT's CPU model trained at 5x its learning rate for half its steps reaches the loss of
    # nanoGPT's 2,000-step recipe (1.905 vs 1.908 on Tiny Shakespeare) in 56 % of its wall time
    # (benchmarks/README.md, "GPT: time to quality").
    # speedrun-cpu: Muon for the blocks' matrices, a short warmup, constant, then a linear cooldown
    # over the last 40 %; 500 steps reach 1.82 on Tiny Shakespeare in 40 % of nanoGPT's wall time
    # (benchmarks/speedrun.py).
    SPEEDRUN_TRAIN = dict(optimizer="muon", muon_lr=0.02, lr=5e-3, min_lr=0.0, schedule="trapezoid", eval_interval=250)
    PRESET_TRAIN = {
        "shakespeare-cpu": dict(lr=5e-3, min_lr=5e-4, warmup_iters=50, max_iters=1000),
        "speedrun-cpu": dict(SPEEDRUN_TRAIN, warmup_iters=20, max_iters=500),
        # the GPU twin: with --target 1.455, 1.451 on Tiny Shakespeare's whole validation split in
        # 500 steps and 56 s on an H100, 0.39 of nanoGPT's 5,000-step run (benchmarks/speedrun_gpu.py,
        # whose sweep chose batch 128 and 600 steps: longer cooldowns overfit)
        "speedrun": dict(SPEEDRUN_TRAIN, warmup_iters=50, max_iters=600, batch_size=128, eval_interval=100),
    }

    def train_defaults_for(self, o):
        return replace(self.train_defaults, **self.PRESET_TRAIN.get(o.preset, {}))

    def check_new(self, o, model_over) -> None:
        if o.task == "chat" and not (o.init and o.data):
            raise ValueError(
                "--task chat fine-tunes a model that has a chat template: give --init CKPT (an instruct model) and "
                "--data FILE.jsonl (conversations)"
            )
        if not o.init:
            return
        if o.tokenizer or o.vocab_size:
            raise ValueError("--init brings its own tokenizer; drop --tokenizer / --vocab-size")
        shape = sorted(k for k in model_over if k not in ("dropout", "context"))
        if shape:
            raise ValueError(
                f"--init fixes the model's shape; drop {', '.join('--' + k.replace('_', '-') for k in shape)}"
            )

    def run_options(self, o, saved):
        # a resumed run may read new text (same tokenizer), but cannot switch tokenizers
        return {"tokenizer": (o.tokenizer, saved["tokenizer"].get("kind"))}

    def prepare(self, o, saved, model_over, tcfg, out):
        from ..data.shards import token_data as prepare
        from ..models.gpt import GPTConfig
        from ..training import LanguageModelTask

        init_state, meta = None, {}
        if saved and saved.get("task") == "chat":
            from ..interop.generation import GenerationSettings
            from ..tokens import tokenizer_from_dict

            cfg = GPTConfig.from_dict(saved["model"])
            spec = o.data if o.data is not None else saved.get("data_spec")
            settings = GenerationSettings.from_dict(saved.get("generation"))
            return self.chat_run(spec, tokenizer_from_dict(saved["tokenizer"]), settings, cfg, tcfg,
                                 {k: saved[k] for k in ("init", "generation") if k in saved}, None)  # fmt: skip
        if saved:
            cfg = GPTConfig.from_dict(saved["model"])
            meta = {k: saved[k] for k in ("init", "generation") if k in saved}
            spec = o.data if o.data is not None else saved.get("data_spec")
            data = prepare(spec, out / "data", data_dir=o.data_dir, existing_tokenizer=saved["tokenizer"],
                           progress=tcfg.progress)  # fmt: skip
        elif o.init:  # fine-tuning: the pretrained model's shape, weights and tokenizer
            pretrained = self.model_of(o.init, "cpu")
            tok, base = pretrained.require_tokenizer(), pretrained.config
            if model_over.get("context", base.context) > base.context:
                raise ValueError(
                    f"--context {model_over['context']} is longer than {o.init}'s {base.context}: "
                    "fine-tuning can shorten the context, not lengthen it"
                )
            if o.task == "chat":
                pretrained.require_chat_template()
                meta = {"init": str(o.init), "generation": pretrained.generation.to_dict()}
                cfg = GPTConfig(**{**base.to_dict(), **model_over})
                return self.chat_run(o.data, tok, pretrained.generation, cfg, tcfg, meta, pretrained.state_dict())
            spec = o.data
            data = prepare(spec, out / "data", data_dir=o.data_dir, existing_tokenizer=tok.to_dict(),
                           progress=tcfg.progress)  # fmt: skip
            cfg = GPTConfig(**{**base.to_dict(), **model_over})
            init_state = pretrained.state_dict()
            meta = {"init": str(o.init)}
            if pretrained.generation:  # (its end-of-sequence ids and chat template: the tuned model ends and chats so)
                meta["generation"] = pretrained.generation.to_dict()
        else:
            spec = o.data
            data = prepare(
                spec,
                out / "data",
                tokenizer=o.tokenizer or "char",
                vocab_size=o.vocab_size,
                data_dir=o.data_dir,
                progress=tcfg.progress,
            )
            vocab = {"vocab_size": data.tokenizer.vocab_size}
            if data.tokenizer.kind != "char":  # BPE: the head padded to a multiple of 64 rows (nanoGPT's 50,304)
                vocab["vocab_multiple"] = 64
            cfg = GPTConfig(**{**self.preset_fields(o), **vocab, **model_over})
        task = LanguageModelTask(data, cfg.context, tcfg.batch_size, loss_chunk=o.loss_chunk)
        summary = (
            f"GPT {cfg.layers} layers, {cfg.heads} heads, {cfg.dim} wide, context {cfg.context} | data "
            f"{data.name}: {len(data.train):,} train / {len(data.val):,} val tokens, vocab "
            f"{data.tokenizer.vocab_size}" + (f" | from {o.init}" if init_state is not None else "")
        )

        return TrainingRun("gpt", cfg, task, {"data_spec": spec, **meta}, summary, _start_from(init_state))

    def chat_run(self, spec, tok, settings, cfg, tcfg, meta: dict, init_state) -> TrainingRun:
        """A chat fine-tuning run (``--task chat``): the conversations of ``spec`` rendered with the
        checkpoint's template (``settings``), the loss on the assistant's tokens
        (:class:`attnlab.training.tasks.ChatTask`); ``init_state``: the weights to start from (None on resume)."""
        from ..data.chat import chat_data
        from ..training.tasks import ChatTask

        data = chat_data(spec, settings.chat_template, tok, cfg.context)
        task = ChatTask(data, cfg.context, tcfg.batch_size)
        assistant = sum(sum(m[1:]) for _, m in data.train)
        summary = (
            f"GPT {cfg.layers} layers, {cfg.heads} heads, {cfg.dim} wide, context {cfg.context} | chat {data.name}: "
            f"{len(data.train):,} train / {len(data.val):,} val conversations, {assistant:,} assistant tokens to learn"
            + (f" | from {meta['init']}" if "init" in meta else "")
        )

        run = TrainingRun(
            "gpt", cfg, task, {"data_spec": spec, "task": "chat", **meta}, summary, _start_from(init_state)
        )
        run.notes = list(data.notes)
        return run

    def finish(self, o, run, trainer, result) -> list[str]:
        lines = super().finish(o, run, trainer, result)
        if o.sample_chars > 0 and o.task != "chat":  # (a chat model's turn is chat's: attnlab chat --ckpt RUN)
            import torch

            from ..generate import default_prompt, generate_text

            torch.manual_seed(trainer.cfg.seed)
            trainer.model.eval()
            tok = run.task.data.tokenizer
            prompt = default_prompt(tok)
            text = generate_text(trainer.model, tok, prompt, o.sample_chars, temperature=0.8, top_k=200)[0]
            lines.append("--- sample ---\n" + prompt.lstrip("\n") + text)
        return lines

    # ---- sample, eval -------------------------------------------------------------------------
    def commands(self) -> list[Command]:
        return [
            Command(
                "sample",
                "generate text from a trained GPT",
                "Continue a prompt, streaming tokens as they come.",
                sample,
                verbs=(GPTVerbs.generate,),
            ),
            Command(
                "chat",
                "talk to an instruct model with its chat template",
                "An interactive conversation with a checkpoint that carries a chat template (an instruct model, "
                "or a run tuned from one): each line you type is a user message, the reply streams as it is "
                "generated and ends where the model ends its turn. /reset starts over, /exit (or Ctrl-D) leaves. "
                "--message asks one question and prints the reply (for scripts).",
                chat,
                verbs=(GPTVerbs.chat,),
            ),
        ]

    def evaluate(
        self,
        model,
        on: Evaluation,
        *,
        block_size: Annotated[
            int | None,
            Arg(
                "language models: window length (default: the model's context)",
                positive_int,
                flags=("--block-size", "--context"),
            ),
        ] = None,
        max_tokens: Annotated[int, Arg("language models: evaluate at most this many tokens", positive_int)] = 200_000,
        quantize: Annotated[
            QuantizeChoice | None,
            Arg("language models, evaluated as attnlab sample --quantize runs them. " + QUANTIZE_HELP),
        ] = None,
    ) -> tuple[dict, str]:
        from ..training.tasks import language_model_scores

        if on.split == "test":
            raise ValueError("language models have train and val splits; use --split val or train")
        split = on.split or "val"
        tok, meta, ckpt = model.require_tokenizer(), model.run_meta, model.checkpoint
        if quantize:  # (on a copy: the loaded model in memory stays as it is)
            from ..generate.quantize import quantized_copy

            model = quantized_copy(model, quantize)
        context = model.config.context
        block = block_size or context
        if block > context:
            raise ValueError(f"--block-size {block} is larger than the model's context of {context}; use at most that")
        if meta.get("task") == "chat":  # (a chat fine-tuning run: its conversations, the assistant's tokens)
            from ..data.chat import chat_data
            from ..training.tasks import ChatTask

            data = chat_data(on.data or meta["data_spec"], model.require_chat_template(), tok, context)
            with on.within(model):
                res = ChatTask(data, context, on.batch_size).evaluate(
                    model, split, batch_size=on.batch_size, max_batches=on.max_batches
                )
            return res, (
                f"{res['data']} [{split}], {res['conversations']:,} conversations, {res['assistant_tokens']:,} "
                f"assistant tokens: loss {res['loss']:.4f} nats/token, perplexity {res['perplexity']:.2f}"
            )
        name, ids = corpus_ids(ckpt, meta, tok, split, on.data, on.data_dir)
        with on.within(model):
            scores = language_model_scores(
                model,
                ids[: max_tokens + 1],
                block,
                tok,
                batch_size=on.batch_size,
                max_batches=on.max_batches,
                what=f"eval {split}",
            )
        res = {"data": name, "split": split, **scores}
        return res, (
            f"{name} [{split}], {res['tokens']:,} tokens: loss {res['loss']:.4f} nats/token, perplexity "
            f"{res['perplexity']:.2f}, {res['bits_per_char']:.3f} bits/char, {res['bits_per_byte']:.3f} bits/byte"
        )

    def inspect(self, model, what: str, out: Path, o: GPTInspection) -> dict:
        import numpy as np
        import torch

        from ..inspect import plots as P

        if what == "heads":
            from ..inspect.detectors import head_scores, repeated_random_tokens

            if o.text:
                idx, where = model.token_ids(o.text, "--text"), f"on {o.text!r}"
            else:  # a random sequence, then again: where previous-token, duplicate and induction heads show
                half = min(model.config.context // 2, 50)
                idx = repeated_random_tokens(8, half, model.config.vocab_size, torch.Generator().manual_seed(0))
                where = f"on 8 random sequences of {half} tokens, each repeated once"
            scores = head_scores(model, idx.to(model.device))
            P.head_scores_png(scores, out, title=f"head detectors {where}")
            return {k: v.numpy() for k, v in scores.items()}
        if not o.text:
            raise ValueError(f'inspect {what} needs --text "some text"')
        if what == "lens":
            table = model.logit_lens(o.text, top_k=3)
            P.lens_png(table, out)
            return {"top_probs": table["top_probs"], "tokens": np.array(table["tokens"])}
        idx = model.token_ids(o.text, "--text")
        if what == "attention":
            from ..inspect.capture import capture_attention

            with torch.no_grad(), capture_attention(model) as rec:
                model(idx)
            maps = torch.stack([w[0] for w in rec.layers()]).float().cpu()  # (L, H, T, T)
            tokens = [model.tokenizer.decode([i]) for i in idx[0].tolist()]
            P.token_attention_png(tokens, tokens, maps.numpy(), out, title=f"attention on {o.text[:60]!r}")
            return {"attention": maps.numpy(), "tokens": np.array(tokens)}
        if o.answer is None:
            with torch.no_grad():
                answer = int(model(idx)[0, -1].argmax())
            named = model.tokenizer.decode([answer])
        else:
            answer, named = model.one_token(o.answer, "--answer"), o.answer
        tokens = [model.tokenizer.decode([i]) for i in idx[0].tolist()]
        if what == "attribution":
            from ..inspect.attribution import text_attributions

            base = None if o.baseline in (None, "zeros") else model.one_token(o.baseline, "--baseline")
            res = text_attributions(model, idx, answer, method=o.method, steps=o.steps, baseline=base)
            scores = res["tokens"][0].numpy()
            gap = "" if res["delta"] is None else f", completeness gap {float(res['delta'][0]):+.3f}"
            title = f"{o.method.replace('_', ' ')}: the logit of {named!r} after the text{gap}"
            P.token_scores_png(tokens, {o.method.replace("_", " "): scores}, out, title=title)
            return {"scores": scores, "tokens": np.array(tokens)}
        # logit-attribution
        from ..inspect.lens import direct_logit_attribution

        parts = {k: float(v[0]) for k, v in direct_logit_attribution(model, idx, answer).items()}
        n_layers, n_heads = len(model.blocks), model.config.heads
        has_mlp = model.blocks[0].mlp is not None
        grid = np.array(
            [
                [parts[f"L{i}.H{h}"] for h in range(n_heads)] + ([parts[f"L{i}.mlp"]] if has_mlp else [])
                for i in range(n_layers)
            ]
        )
        rest = {k: v for k, v in parts.items() if not (k.endswith(".mlp") or ".H" in k)}
        fig_title = (
            f"direct logit attribution to {named!r} after {o.text[-60:]!r}\n"
            f"logit {sum(parts.values()):.2f} = the cells + " + ", ".join(f"{k} {v:+.2f}" for k, v in rest.items())
        )
        P.contributions_png(
            grid,
            out,
            rows=[f"layer {i}" for i in range(n_layers)],
            cols=[f"H{h}" for h in range(n_heads)] + (["MLP"] if has_mlp else []),
            title=fig_title,
        )
        return {"contributions": grid, **{k: np.array(v) for k, v in rest.items()}}

    def explore(self, model, text: str | None = None, *, generate: int = 0, sae=None) -> dict:
        from ..inspect.explorer import text_attention

        if not text:
            raise ValueError('explore a GPT with --text "some text"')
        tok = model.require_tokenizer()
        tok.encode(text)  # unknown characters fail here, with a clear message
        if sae:
            from ..inspect.sae import load_sae

            sae = load_sae(sae, str(next(model.parameters()).device))[0]
        return text_attention(model, tok, text, generate=generate or 0, sae=sae or None)


def _start_from(init_state):
    """A run's setup: load the pretrained weights ``init_state`` (None: a new or resumed run's own)."""

    def setup(model) -> None:
        if init_state is not None:
            own = model.state_dict()
            state = {  # a shorter context keeps the first positions of a position table
                k: v[: own[k].shape[0]] if k in own and v.shape[1:] == own[k].shape[1:] else v
                for k, v in init_state.items()
            }
            model.load_state_dict(state)

    return setup


def load_draft(draft, tokenizer, vocab_size: int, device: str):
    """The draft GPT for speculative decoding with a model of ``tokenizer`` and ``vocab_size``: a
    loaded model, which must share the vocabulary, or a run folder, which must hold the same
    tokenizer (one line refuses either otherwise)."""
    import torch

    if isinstance(draft, torch.nn.Module):
        from ..models.gpt import GPT

        if not isinstance(draft, GPT):
            raise OptionError(f"draft= must be a GPT with this model's tokenizer; got {a(type(draft).__name__)}")
        if draft.config.vocab_size != vocab_size:
            raise OptionError(
                f"draft=: the draft GPT has a vocabulary of {draft.config.vocab_size}, this model "
                f"{vocab_size}; the draft must share this model's tokenizer"
            )
        return draft.to(device)
    small = GPTRecipe.model_of(draft, device)
    if small.require_tokenizer().to_dict() != tokenizer.to_dict():
        raise OptionError(f"--draft {draft} has another tokenizer than --ckpt; train the draft on the same one")
    return small


def corpus_ids(ckpt, meta: dict, tok, split: str, data: str | None = None, data_dir: str | None = None):
    """(the corpus's name, its ``split`` as a 1-D array of token ids) for the language model in
    ``ckpt``: the run's own prepared data (memory-mapped) when ``data`` is None and its tokenizer
    matches, else ``data`` (or the run's data spec) read and encoded with ``tok``."""
    import numpy as np

    from ..data import hf, sources
    from ..data.shards import encoded_text, is_shard_folder, open_shards, read_index
    from ..data.text import load_corpus, split_ids

    run = Path(ckpt)
    if run.name in ("best", "last"):  # (a checkpoint folder: its run's data)
        run = run.parent
    cache = run / "data" / "meta.json"
    if data is None and cache.is_file() and meta.get("tokenizer") == json.loads(cache.read_text())["tokenizer"]:
        m = json.loads(cache.read_text())
        return m["name"], np.memmap(run / "data" / f"{split}.bin", dtype=np.dtype(m["dtype"]), mode="r")
    spec = data if data is not None else meta.get("data_spec")
    if data is None:  # a dataset the run prepared into shards, with this tokenizer
        for folder in sorted((run / "data").glob("shards-*")):
            index = read_index(folder) if is_shard_folder(folder) else {}
            if index.get("done") and index["tokenizer"] == tok.to_dict():
                shards = open_shards(folder, tok.to_dict())
                return shards.name, shards.val if split == "val" else shards.train
    if is_shard_folder(spec):  # prepared token shards: memory-mapped, if they use this tokenizer
        shards = open_shards(spec, tok.to_dict())
        return shards.name, shards.val if split == "val" else shards.train
    if isinstance(spec, str) and not hf.is_hf(spec) and spec not in sources.NAMED and Path(spec).expanduser().exists():
        train_ids, val_ids = split_ids(encoded_text(spec, tok))  # (a held-out file of any size: streamed)
        return spec, val_ids if split == "val" else train_ids
    name, text = load_corpus(spec, data_dir)
    train_ids, val_ids = split_ids(tok.encode(text))
    return name, np.asarray(val_ids if split == "val" else train_ids)


def tokenizer_that_fits(tokenizer, vocab_size: int, ckpt):
    """``tokenizer``, refused when it has more tokens than the model's vocabulary (an edited or mixed
    run folder: its ids past the vocabulary would index outside the embedding), or, for attnlab's
    character and word tokenizers (a run sizes its vocabulary to them exactly), fewer: the weights
    would be read through another mapping of ids to text. (A BPE vocabulary may be smaller than the
    model's: HuggingFace checkpoints pad theirs to a round size.)"""
    from ..errors import CheckpointError

    if tokenizer is None:
        return tokenizer
    exact = tokenizer.to_dict().get("type") in ("char", "word")
    if tokenizer.vocab_size > vocab_size or (exact and tokenizer.vocab_size != vocab_size):
        raise CheckpointError(
            f"{ckpt}: the tokenizer of its config.json has {tokenizer.vocab_size} tokens and its model a vocabulary "
            f"of {vocab_size}; the folder mixes two runs (train again, or restore its config.json)"
        )
    return tokenizer


def lm_tokenizer(meta: dict, ckpt):
    """The tokenizer of a GPT run (from its config.json) or of a HuggingFace folder (tokenizer.json)."""
    from ..errors import CheckpointError
    from ..tokens import BPETokenizer, tokenizer_from_dict

    if meta.get("tokenizer"):
        return tokenizer_from_dict(meta["tokenizer"])
    if (Path(ckpt) / "tokenizer.json").is_file():
        return BPETokenizer.load(Path(ckpt) / "tokenizer.json")
    raise CheckpointError(f"{ckpt} has no tokenizer (no tokenizer in config.json, no tokenizer.json)")


def sample(
    ckpt: Annotated[str, Arg("run folder (or checkpoint / HuggingFace folder)")],
    *,
    prompt: Annotated[str, Arg("text to continue (default: start from a newline)")] = "",
    num_samples: Annotated[int, Arg("how many samples (per prompt)", positive_int)] = 1,
    prompts_file: Annotated[
        str | None,
        Arg(
            "continue every line of this UTF-8 file (one prompt per line, blank lines skipped), --batch-size at a "
            "time by continuous batching; printed in the file's order"
        ),
    ] = None,
    dtype: DecodeDtype = "fp32",
    draft: Annotated[
        str | None,
        Arg(
            "speculative decoding: a small GPT run trained with the same tokenizer proposes tokens that --ckpt "
            "checks several at a time (same output distribution; faster when the draft guesses well)"
        ),
    ] = None,
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab sample``: continue a prompt, streaming, through the loaded model's own
    :meth:`GPTVerbs.generate` (one path for the command line and Python; ``options``: its
    keywords); sample i draws with seed ``seed + i``, as the i-th of a list of prompts does in Python."""
    from ..training.devices import pick_device

    quantize = options.pop("quantize", None)
    if prompts_file:
        return sample_many(ckpt, prompts_file, num_samples, dtype, quantize, device, prompt=prompt, draft=draft,
                           **options)  # fmt: skip
    if options.get("compile") and (draft or not options.get("use_cache", True)):
        raise OptionError("--compile decodes with the KV cache and no draft: drop --draft and --no-cache")
    dev, torch_dtype = str(pick_device(device)), decode_dtype(dtype)
    model = GPTRecipe.model_of(ckpt, dev, dtype=torch_dtype)
    model.require_tokenizer()  # (a HuggingFace folder of weights alone: said before anything else)
    draft_model = None
    if draft:  # (loaded here to take --dtype too)
        draft_model = load_draft(draft, model.tokenizer, model.config.vocab_size, dev)
        draft_model = draft_model.to(torch_dtype) if torch_dtype is not None else draft_model
    model = as_sampled(model, quantize)
    if options.get("compile"):  # (said once, not once a sample)
        from ..generate.quantize import compiles

        options["compile"] = compiles(model, True)
    out = sys.stdout

    def stream(piece: str) -> None:
        out.write(piece)
        out.flush()

    seed = options.pop("seed", None)
    for i in range(num_samples):
        out.write(prompt)
        model.generate(prompt, draft=draft_model, stream=stream,
                       seed=None if seed is None else (seed + i) % 2**63, **options)  # fmt: skip
        out.write("\n" if i == num_samples - 1 else "\n---------------\n")
        out.flush()
    if options.get("compile"):  # whether the step really compiled once (and, on CUDA, runs as a CUDA graph)
        from ..generate.fast import graph_lines

        for line in graph_lines(model):
            print(line, file=sys.stderr)
    return 0


def chat(
    ckpt: Annotated[str, Arg("a checkpoint with a chat template (HuggingFace folder or a run tuned from one)")],
    *,
    message: Annotated[str | None, Arg("one user message: print the reply and exit (default: a conversation)")] = None,
    system: Annotated[str | None, Arg("a system message that opens the conversation")] = None,
    dtype: DecodeDtype = "fp32",
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab chat``: the loaded model's :meth:`GPTVerbs.chat`, one message (``--message``) or
    a conversation read line by line from standard input, each reply streamed."""
    from ..training.devices import pick_device

    model = GPTRecipe.model_of(ckpt, str(pick_device(device)), dtype=decode_dtype(dtype))
    model.require_chat_template()  # (a model without one: said before anything is asked)
    opening = [{"role": "system", "content": system}] if system else []
    messages = list(opening)

    def stream(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    def reply(text: str) -> None:
        messages.append({"role": "user", "content": text})
        while len(messages) > len(opening) + 1:  # past the context: the oldest exchange goes, as chat apps do
            try:
                model.chat_ids(messages)
                break
            except OptionError:
                del messages[len(opening) : len(opening) + 2]  # (its user message and the reply; the system stays)
                warnings.warn("the conversation filled the model's context: its oldest exchange was dropped", Note)
        answer = model.chat(messages, stream=stream, **options)
        messages.append({"role": "assistant", "content": answer})
        sys.stdout.write("\n")
        sys.stdout.flush()

    if message is not None:
        if not message.strip():
            raise OptionError("--message is empty; give the text to send")
        reply(message)
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"chatting with {ckpt}: type a message; /reset starts over, /exit or Ctrl-D leaves", file=sys.stderr)
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line or line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            messages = list(opening)
        elif line.strip():
            reply(line.rstrip("\n"))


def decode_dtype(dtype: str):
    """The torch dtype ``--dtype`` asks the model to be loaded in (None for fp32: as saved, a
    HuggingFace checkpoint in float32): a bf16 model is read so, never widened to a float32 copy first."""
    import torch

    return torch.bfloat16 if dtype == "bf16" else None


def as_sampled(model, quantize: str | None):
    """The model, loaded in :func:`decode_dtype`, with the layers ``--quantize`` asks ``sample`` for."""
    if quantize:
        from ..generate.quantize import quantize as quantized

        model = quantized(model, quantize)
    return model


def sample_many(
    ckpt, prompts_file: str, num_samples: int, dtype: str, quantize, device: str, *, prompt: str, draft, **options
) -> int:
    """``attnlab sample --prompts-file``: every line's continuation by continuous batching (the
    loaded model's ``generate`` of a list), each printed (prompt, then continuation) as soon as it
    and those before it are done."""
    if options.get("compile"):  # (continuous batching's rows change every step: its step is not the fixed-shape one)
        raise OptionError("--prompts-file batches prompts by continuous batching, which --compile does not cover yet")
    given_flags = (("--prompt", prompt), ("--draft", draft), ("--no-cache", not options.get("use_cache", True)))
    for flag, given in given_flags:
        if given:
            raise OptionError(f"--prompts-file reads the prompts from the file; drop {flag}")
    if Path(prompts_file).exists() and not Path(prompts_file).is_file():  # (a FIFO without a writer: read forever)
        raise OptionError(
            f"--prompts-file {prompts_file} is not a regular file (a folder, a FIFO, a device); give a text file"
        )
    try:
        lines = Path(prompts_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise OptionError(f"--prompts-file {prompts_file}: cannot read it as UTF-8 text ({e})") from None
    prompts = [line for line in lines if line.strip() for _ in range(num_samples)]
    if not prompts:
        raise OptionError(f"--prompts-file {prompts_file} has no prompt (every line is blank)")
    model = as_sampled(GPTRecipe.model_of(ckpt, device, dtype=decode_dtype(dtype)), quantize)
    texts: dict[int, str] = {}
    shown = [0]

    def on_done(i: int, text: str) -> None:
        texts[i] = text
        while shown[0] in texts:  # print in the file's order
            j = shown[0]
            sys.stdout.write(("" if j == 0 else "---------------\n") + prompts[j] + texts[j] + "\n")
            sys.stdout.flush()
            shown[0] += 1

    options.pop("use_cache", None)
    options.pop("compile", None)
    options.pop("draft_tokens", None)
    model.generate(prompts, stream=on_done, **options)  # (one path: the loaded model's own generate)
    return 0
