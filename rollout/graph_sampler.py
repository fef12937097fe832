"""The CUDA-graph sampler engine: static KV cache, one captured decode step per batch bucket, on-device
sampling, log-probs and stop bookkeeping. Same API and draws as the reference loop (``local.py``).

Per batch of n prompts (at most ``batch_size``):

1. Prefill: the model's own forward over the left-padded prompts (exactly the reference loop's prefill); its
   K/V go into the static cache [bucket, Hkv, S, D] per layer, slots 0..L-1, and token 0 is sampled from its
   last logits.
2. Decode: ``GraphSampler._step`` (``decoder.decode_logits`` + sampling + bookkeeping) runs on the first
   ``bucket`` rows of the static state, bucket = the smallest power of two >= the live rows. Its first run
   for a (bucket, sampling-params) key is eager and doubles as the warm-up; it is then captured once and
   replayed token after token. Inside the step nothing reads back to the host: the token counter, cache slot
   and positions are device tensors advanced in place, finished rows write to a trash row.
3. Every ``check_every`` tokens the host reads the live-row mask once: it stops when all rows finished and
   compacts the live rows into a smaller bucket when they fit one (rows past the live ones copy row 0, so
   every row stays a real, finite sequence; their outputs go to the trash row).

Draws use the per-row counter streams (``rng.py``): row i of a call draws token t with
``row_uniforms(seed, i, t)``, so results do not depend on buckets, compaction or batch size, and equal the
reference loop's wherever the logits are equal.

Graphs stay valid while the tensors they read keep their addresses: parameters updated in place, and NVFP4
weights re-quantized into the same buffers (``ModelWeightSync``). A fingerprint of those addresses is
taken after every prefill. When only the quantized forward weights were made afresh (a module re-quantized
its own weight on the prefill, as every module does without ``ModelWeightSync``, e.g. in an fp32 model), their
values are copied into the buffers the graphs read and those buffers go back into the modules' caches
(``stats["refills"]``); when anything else changed (new parameters, another layout, an entry the prefill did
not refresh) the graphs are re-captured. Whenever a capture fails, the step runs eagerly and
``describe()`` says why.
"""
from __future__ import annotations

import math
import time

import torch

from minite_kernels import WeightCache, strict_decode_attention
from rollout import attention as attn
from rollout.decoder import decode_logits, decoder_view
from rollout.fused import functions
from rollout.local import DRAW, Completion, Sampler, SamplingParams, left_pad
from rollout.packed import PackedLinears
from rollout.rng import seed_word
from rollout.sampling import draw

#: the cache length grows in these steps (a longer call re-allocates the cache and re-captures); a decode
#: step attends over the first multiple of SEQ_ROUND slots that holds its slot (one graph per such length)
SEQ_ROUND = 128
ATTENTION = ("auto", "triton", "sdpa", "strict")


def bucket_of(n: int) -> int:
    """Smallest power of two >= n (the graph buckets are 1, 2, 4, 8, ...)."""
    return 1 << max(0, math.ceil(math.log2(n)))


class _State:
    """Static device buffers of one decode batch; the graphs read and write these and nothing else."""

    def __init__(self, view, rows: int, seq: int, steps: int, nstops: int, dtype, device) -> None:
        shape = (rows, view.num_kv_heads, seq, view.head_dim)
        self.rows, self.seq, self.steps, self.nstops = rows, seq, steps, nstops
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(view.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(view.num_layers)]
        i64 = dict(dtype=torch.int64, device=device)
        self.tok = torch.zeros(rows, **i64)
        self.pos = torch.zeros(rows, **i64)
        self.row = torch.zeros(rows, **i64)           # output row of each slot (``rows`` = the trash row)
        self.rng_row = torch.zeros(rows, **i64)       # stream id of each slot: its index in the generate() call
        self.start = torch.zeros(rows, **i64)         # first valid cache slot (left padding) of each row
        self.done = torch.ones(rows, dtype=torch.bool, device=device)
        self.valid = torch.zeros(rows, seq, dtype=torch.bool, device=device)
        self.slot = torch.zeros(1, **i64)
        self.step = torch.zeros(1, **i64)
        self.key = torch.zeros(1, **i64)
        self.stops = torch.full((nstops,), -1, **i64)
        self.out_tok = torch.zeros(rows + 1, steps, **i64)
        self.out_logp = torch.zeros(rows + 1, steps, dtype=torch.float32, device=device)
        self.out_len = torch.zeros(rows + 1, **i64)
        self.out_stop = torch.zeros(rows + 1, dtype=torch.bool, device=device)

    def per_row(self) -> list[torch.Tensor]:
        return [self.tok, self.pos, self.row, self.rng_row, self.start, self.done, self.valid]


class GraphSampler(Sampler):
    """``LocalSampler``'s API on a static KV cache with CUDA-graph decode steps (eager on CPU or as fallback).

    ``graphs``: "auto" (capture on CUDA), True (require capture on CUDA: a failure raises) or False (eager).
    ``fused``: "auto" (the fused elementwise functions of ``fused.py``, compiled, on CUDA for models they
    cover), True (fused: compiled on CUDA, eager elsewhere) or False (the model's modules op by op).
    ``attention``: "auto" (the Triton decode-attention kernel on CUDA when Triton imports, else SDPA),
    "triton" or "sdpa" (``attention.py``).
    ``alignment``: "default", or "strict": the step runs the model's own modules (no fused functions, no packed
    GEMMs) and ``minite_kernels.strict.decode_attention`` under ``StrictMode``, so every reduction is
    batch-invariant and the log-probs equal the learner's bit for bit.
    ``pack``: with the fused functions, run each layer's q/k/v and gate/up projections as one GEMM each over
    packed weight copies (``packed.py``: plain linears, and NVFP4 linears on minite's fast lane, whose packed
    copy is the dequantized weight; extra memory, ``describe()["packed_bytes"]``).
    ``check_every``: tokens between two host reads of the live-row mask.
    ``norm_quant``: with packed NVFP4 groups, make each group's X̂ in the launch of the op before it
    (``minite_kernels.backends.triton.norm_quant``: residual add + RMSNorm, or the SiLU product for the down
    projection, + the lane's activation quantizer) instead of that op's launch and a quantizer launch; the
    down projections' Ŵ is then kept as a one-module group (``describe()["packed_bytes"]``). "auto": on where
    the engine holds FP4-weight groups (``fp4_weights``), whose down projections are one-module groups anyway.
    False by default here; the trainer's and ``make_sampler``'s default is "auto".
    ``fp4_weights``: "auto", True or False: packed NVFP4 groups (and then the o and down projections) hold the
    NVFP4 bytes and run the FP4-weight GEMM (``packed.py``, ``minite_kernels.backends.triton.fp4w``), where its
    measured table prefers it ("auto") or wherever it runs (True); False keeps the BF16 Ŵ copies.
    ``describe()`` reports the groups and the weight bytes the decode step reads.
    """

    name = "graph"

    def __init__(self, model, tokenizer, *, batch_size: int | None = None, graphs: bool | str = "auto",
                 fused: bool | str = "auto", attention: str = "auto", pack: bool = True,
                 check_every: int = 8, alignment: str = "default", norm_quant: bool | str = False,
                 fp4_weights: bool | str = "auto") -> None:
        for name, v in (("graphs", graphs), ("fused", fused)):
            if v not in ("auto", True, False):
                raise ValueError(f"{name} must be 'auto', True or False, got {v!r}")
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.view = decoder_view(model)
        super().__init__(model, tokenizer, batch_size=batch_size, alignment=alignment)
        cuda = self.device.type == "cuda"
        if alignment == "strict":  # the model's own modules and the strict attention, under StrictMode
            if fused is True or attention not in ("auto", "strict"):
                raise ValueError("alignment='strict' runs the model's modules and the batch-invariant attention: "
                                 f"fused=True / attention={attention!r} do not apply")
            fused, pack, attention = False, False, "strict"
        if fused is True and self.view.unfusable:
            raise ValueError(f"fused=True: {self.view.unfusable}")
        use_fused = fused is True or (fused == "auto" and cuda and self.view.unfusable is None)
        self.fused = ("compiled" if cuda else "eager") if use_fused else "off"
        self._fns = functions(compile_=cuda) if use_fused else None
        if norm_quant not in ("auto", True, False):
            raise ValueError(f"norm_quant must be 'auto', True or False, got {norm_quant!r}")
        self._packed = (PackedLinears(self.view, down=norm_quant is True, fp4=fp4_weights)
                        if use_fused and pack else None)
        if self._packed is not None and not self._packed.any:
            self._packed = None
        if norm_quant is True and (self._packed is None or not self._packed.quantized_groups):
            raise ValueError("norm_quant=True quantizes the input of packed NVFP4 groups, and this engine has none "
                             "(it needs fused functions, pack=True and a model on minite's NVFP4 fast lane)")
        # auto: on where the engine holds FP4-weight groups (there the down projections are one-module FP4 groups
        # already, so it keeps no extra copy; measured faster at the 4B and 8B shapes, benchmarks/RESULTS.md)
        self.norm_quant = norm_quant is True or (
            norm_quant == "auto" and self._packed is not None and self._packed.fp4_groups > 0)
        if attention == "auto":
            attention = "triton" if cuda and attn.triton is not None else "sdpa"
        if attention == "strict" and alignment != "strict":
            raise ValueError("attention='strict' is the batch-invariant kernel of alignment='strict'; pass that")
        if attention == "triton" and attn.triton is None:
            raise ValueError("attention='triton' needs Triton (pip install 'minite-rl[gpu]')")
        self.attention = attention
        self._sms = torch.cuda.get_device_properties(self.device).multi_processor_count if cuda else 1
        self.check_every = int(check_every)
        self.graphs_mode = graphs
        self._state: _State | None = None
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._fingerprint: tuple | None = None
        self._held: list = []  # the quantized weights the graphs read, kept alive while they exist
        self._held_keys: list = []  # their cache keys, in the order of ``_fprop_entries``
        self.eager_reason: str | None = None
        #: counts, and ``capture_s``: host seconds spent on new graph keys (the eager warm-up step, which
        #: compiles any kernel the new shape needs, plus the capture)
        self.stats = {"captures": 0, "replays": 0, "eager_steps": 0, "compactions": 0, "host_checks": 0,
                      "refills": 0, "capture_s": 0.0}

    def _use_graphs(self) -> bool:
        return self.graphs_mode is not False and self.device.type == "cuda" and self.eager_reason is None

    def describe(self) -> dict:
        mode = "cuda_graph" if self._use_graphs() else "eager"
        if self.device.type != "cuda":
            why = "not a CUDA device"
        elif self.graphs_mode is False:
            why = "graphs=False"
        else:
            why = self.eager_reason
        return {"sampler": self.name, "sampling_backend": DRAW, "decode": mode, "eager_reason": why,
                "fused": self.fused, "fused_off_reason": self.view.unfusable, "attention": self.attention,
                "packed_bytes": self._packed.nbytes if self._packed else 0,
                "packed_quantized_groups": self._packed.quantized_groups if self._packed else 0,
                **self._weight_memory(),
                "norm_quant": self.norm_quant, **self.stats}

    def _weight_memory(self) -> dict:
        """``fp4_weight_groups``: packed groups that run on FP4 weights; ``quantized_weight_bytes``: what the
        decode step reads for the packed quantized linears' weights, and ``_vs_bf16``: that over the same
        weights' BF16 bytes (FP4: 0.5625 / 2 plus a factor per row; Ŵ copies: 1)."""
        if not self._packed or not self._packed.quantized_groups:
            return {"fp4_weight_groups": 0, "quantized_weight_bytes": 0, "quantized_weight_bytes_vs_bf16": None}
        held, bf16 = self._packed.quantized_weight_bytes()
        return {"fp4_weight_groups": self._packed.fp4_groups, "quantized_weight_bytes": held,
                "quantized_weight_bytes_vs_bf16": held / bf16}

    # ------------------------------------------------------------------------------------------ state
    def _ensure_state(self, rows: int, seq: int, steps: int, nstops: int) -> _State:
        st = self._state
        if st is None or st.rows < rows or st.seq < seq or st.steps < steps or st.nstops < nstops:
            rows = max(rows, st.rows if st else 0)
            seq = max(seq, st.seq if st else 0)
            steps = max(steps, st.steps if st else 0)
            nstops = max(nstops, st.nstops if st else 0)
            self._drop_graphs()
            self._state = None
            seq = -(-seq // SEQ_ROUND) * SEQ_ROUND
            self._state = st = _State(self.view, rows, seq, steps, nstops, self._dtype(), self.device)
        return st

    def _dtype(self) -> torch.dtype:
        return self.view.embed.weight.dtype

    def _drop_graphs(self) -> None:
        """Forget every graph, and their memory pool: the next capture starts a new pool. PyTorch's allocator
        cannot reopen a pool whose graphs were all released while some of its blocks are still allocated (a
        tensor made during a capture and kept past it): ``beginAllocateToPool`` fails its ``use_count > 0``
        assertion, the capture fails, and every later step would run eagerly. The old pool's memory is
        returned once its blocks are free."""
        self._graphs.clear()
        self._pool = None
        self._held = []
        self._held_keys = []
        self._fingerprint = None

    def _fprop_entries(self) -> list[tuple]:
        """``(module, cache, key, token, value)`` of every forward weight (and derived GEMM operand) cached in
        minite modules (``WeightCache.entries``). The learner's backward entries (dgrad / wgrad operands) are
        left out: the decode step never reads them."""
        out = []
        for m in self.model.modules():
            cache = WeightCache.of(m)
            if cache is None or not len(cache):
                continue
            for key, token, value in sorted(cache.entries(), key=lambda e: repr(e[0])):
                if isinstance(key, tuple) and key and key[0] == "fprop":
                    out.append((m, cache, key, token, value))
        return out

    def _weights_fingerprint(self) -> tuple[tuple, list]:
        """Addresses of every tensor a captured step reads besides the state: parameters, and the cached
        forward weights; and those cached values (the graphs' ``held`` buffers)."""
        ptrs: list = [p.data_ptr() for p in self.model.parameters()]
        held: list = []
        for _, _, key, _, value in self._fprop_entries():
            held.append(value)
            ptrs.append(repr(key))
            ptrs.extend(t.data_ptr() for t in WeightCache.fields(value).values() if isinstance(t, torch.Tensor))
        return tuple(ptrs), held

    def _refill_held(self) -> bool:
        """Copy freshly made forward weights into the buffers the graphs read (``self._held``) and put those
        buffers back into the modules' caches. False, changing nothing, unless the parameters kept their
        addresses, every entry matches its held buffer in key, layout and non-tensor fields, and every entry
        is current (made from the module's present weight): a stale one would be re-made at its next use,
        outside the graphs."""
        if not self._held or self._fingerprint is None:
            return False
        n_params = sum(1 for _ in self.model.parameters())
        if tuple(p.data_ptr() for p in self.model.parameters()) != self._fingerprint[:n_params]:
            return False
        current = self._fprop_entries()
        if len(current) != len(self._held) or len(current) != len(self._held_keys):
            return False
        moves = []
        for (m, cache, key, token, value), held, held_key in zip(current, self._held, self._held_keys):
            weight = getattr(m, "weight", None)
            if key != held_key or not isinstance(weight, torch.Tensor) or token != cache.token(weight):
                return False
            if value is held:
                continue
            new, old = WeightCache.fields(value), WeightCache.fields(held)
            if new.keys() != old.keys():
                return False
            for name, x in new.items():
                y = old[name]
                if isinstance(x, torch.Tensor):
                    if not (isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
                            and x.device == y.device and x.stride() == y.stride()):
                        return False
                elif isinstance(y, torch.Tensor) or not _same(x, y):
                    return False
            moves.append((cache, key, held))
        with torch.no_grad():
            for cache, key, held in moves:
                cache.update_in_place(key, held)
        self.stats["refills"] += 1
        return True

    def _clear_backend_caches(self) -> None:
        for m in self.model.modules():
            backend_for = getattr(m, "backend_for", None)
            if backend_for is None:
                continue
            backend = backend_for(self.device)
            clear = getattr(backend, "clear_cache", None)
            if clear is not None:
                clear()

    # ------------------------------------------------------------------------------------------ batch
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, row0: int) -> list[Completion]:
        from transformers import DynamicCache

        n, L, T = len(prompts), max(len(p) for p in prompts), params.max_new_tokens
        stops = sorted(set(self.default_stop_ids) | set(params.stop_token_ids))
        b = bucket_of(n)
        st = self._ensure_state(bucket_of(max(n, self.batch_size or 0)), L + T, T, max(8, len(stops)))
        dev = self.device

        # prefill: the reference loop's forward, then its K/V into the static cache
        input_ids, mask, position_ids = left_pad(prompts, self.pad_id, dev)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                            past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        fill = torch.cat([torch.arange(n, device=dev), torch.zeros(b - n, dtype=torch.long, device=dev)])
        for i, layer in enumerate(cache.layers):
            st.keys[i][:b, :, :L].copy_(layer.keys.index_select(0, fill))
            st.values[i][:b, :, :L].copy_(layer.values.index_select(0, fill))
        del cache
        st.valid.zero_()
        st.valid[:b, :L].copy_(mask.bool().index_select(0, fill))
        st.valid[:b, L] = True
        st.pos[:b].copy_((position_ids[:, -1] + 1).index_select(0, fill))
        st.start[:b].copy_((L - mask.sum(-1)).index_select(0, fill))
        live = torch.arange(b, device=dev) < n
        st.row[:b].copy_(torch.where(live, torch.arange(b, device=dev), st.rows))
        st.rng_row[:b].copy_(torch.arange(b, device=dev).masked_fill(~live, 0) + row0)
        st.done[:b].copy_(~live)
        st.slot.fill_(L)
        st.step.zero_()
        st.key.fill_(seed_word(params.seed))
        st.stops.fill_(-1)
        if stops:
            st.stops[:len(stops)].copy_(torch.tensor(stops, device=dev))
        st.out_len.zero_()
        st.out_stop.zero_()
        self._record(st, b, logits.index_select(0, fill), params)
        if self._packed is not None:
            self._packed.refresh()

        if self._use_graphs():
            fp, held = self._weights_fingerprint()
            if fp != self._fingerprint and not self._refill_held():
                self._drop_graphs()
                self._fingerprint, self._held = fp, held
                self._held_keys = [key for _, _, key, _, _ in self._fprop_entries()]
        done = 1
        while done < T:
            k = min(self.check_every, T - done)
            for j in range(k):
                slot = L + done - 1 + j  # the slot this step writes (its input token's)
                s = st.seq if self.attention in ("triton", "strict") else min(st.seq, (slot // SEQ_ROUND + 1) * SEQ_ROUND)
                self._run_step(st, b, s, params)
            done += k
            if done >= T:
                break
            self.stats["host_checks"] += 1
            alive = (~st.done[:b]).nonzero().flatten()
            if alive.numel() == 0:
                break
            nb = bucket_of(alive.numel())
            if nb < b:
                self._compact(st, alive, nb)
                b = nb

        lengths = st.out_len[:n].tolist()
        stopped = st.out_stop[:n].tolist()
        toks, logps = st.out_tok[:n].tolist(), st.out_logp[:n].tolist()
        rows = st.out_logp[:n].clone()  # the buffer is the next call's: the learner gets its own copy
        return [Completion(prompt_ids=list(p), token_ids=toks[i][:lengths[i]], logprobs=logps[i][:lengths[i]],
                           finish_reason="stop" if stopped[i] else "length",
                           extra={"sampling_backend": DRAW, "sampler": self.name},
                           logprob_row=rows[i, :lengths[i]])
                for i, p in enumerate(prompts)]

    def _compact(self, st: _State, alive: torch.Tensor, nb: int) -> None:
        n = alive.numel()
        g = torch.cat([alive, alive[:1].expand(nb - n)])
        for t in st.per_row():
            t[:nb] = t.index_select(0, g)
        st.done[n:nb] = True
        st.row[n:nb] = st.rows
        for c in (*st.keys, *st.values):
            c[:nb] = c.index_select(0, g)
        self.stats["compactions"] += 1

    # ------------------------------------------------------------------------------------------ step
    def _record(self, st: _State, b: int, logits: torch.Tensor, params: SamplingParams) -> None:
        """Sample token ``step`` of the first ``b`` slots from ``logits`` and record it (device only)."""
        fn = self._fns["draw"] if self._fns is not None else draw
        tok, lp = fn(logits, params.temperature, params.top_k, params.top_p, st.key, st.rng_row[:b], st.step)
        done = st.done[:b]
        dst = torch.where(done, st.rows, st.row[:b])
        at = st.step.expand(b)
        st.out_tok.index_put_((dst, at), tok)
        st.out_logp.index_put_((dst, at), lp)
        st.out_len.index_put_((dst,), at + 1)
        hit = (tok.unsqueeze(1) == st.stops.unsqueeze(0)).any(1)
        st.out_stop.index_put_((dst,), hit & ~done)
        done |= hit
        st.tok[:b].copy_(tok)

    def _step(self, st: _State, b: int, s: int, params: SamplingParams) -> None:
        """One decode step of the first ``b`` rows over the first ``s`` cache slots: the body that is captured.
        The step gets the cache rows at full length (so the fused functions' shapes depend on ``b`` only, one
        compiled entry per bucket); the SDPA attention reads the first ``s`` slots of them."""
        keys = [k[:b] for k in st.keys]
        values = [v[:b] for v in st.values]
        if self.attention == "triton":
            start, end = st.start[:b], st.slot + 1
            splits = attn.num_splits(b, self.view.num_kv_heads, s, self._sms)

            def attend(q, k, v, scale):
                return attn.decode_attention(q, k, v, start, end, scale, splits=splits)
        elif self.attention == "strict":
            start, end = st.start[:b], st.slot + 1

            def attend(q, k, v, scale):
                return strict_decode_attention(q, k, v, start, end, scale)
        else:
            mask = st.valid[:b, :s]

            def attend(q, k, v, scale):
                return attn.decode_attention_ref(q, k[:, :, :s], v[:, :, :s], mask, scale)
        logits = decode_logits(self.view, keys, values, st.tok[:b], st.pos[:b], st.slot, attend, self._fns,
                               self._packed.layers if self._packed is not None else None, self.norm_quant,
                               self._packed.down if self._packed is not None else None,
                               self._packed.o if self._packed is not None else None)
        st.step += 1
        self._record(st, b, logits, params)
        st.pos[:b] += 1
        st.slot += 1
        st.valid[:b].index_fill_(1, st.slot, True)

    def _run_step(self, st: _State, b: int, s: int, params: SamplingParams) -> None:
        if not self._use_graphs():
            self._step(st, b, s, params)
            self.stats["eager_steps"] += 1
            return
        key = (b, s, params.temperature, params.top_k, params.top_p)
        g = self._graphs.get(key)
        if g is not None:
            g.replay()
            self.stats["replays"] += 1
            return
        t0 = time.perf_counter()
        self._step(st, b, s, params)  # eager: this token, and the warm-up of every kernel the capture records
        self.stats["eager_steps"] += 1
        torch.cuda.synchronize(self.device)
        self._clear_backend_caches()
        g = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(g, pool=self._pool):
                self._step(st, b, s, params)
        except Exception as e:  # noqa: BLE001 - any capture failure means: run eagerly, and say why
            if self.graphs_mode is True:
                raise
            self.eager_reason = f"CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self._drop_graphs()
            torch.cuda.synchronize(self.device)
            return
        finally:
            self._clear_backend_caches()
            self.stats["capture_s"] += time.perf_counter() - t0
        self._graphs[key] = g
        self.stats["captures"] += 1


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - fields that do not compare are treated as different
        return a is b
