"""The plain onnxruntime greedy loop over a KV-cache LLM export (Optimum or onnxruntime-genai
I/O names), shared by make_llm_models.py, which computes the references in tests/models/llm/
with it, and tests/test_llm_fixtures.py, which checks that they reproduce.  NumPy and
onnxruntime only."""

import numpy as np


def run_step(sess, feeds):
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def past_inputs(sess, head_dim):
    """The past inputs and their [B, kvH, P, D] shapes' heads / head size (the genai builder
    names the head size ``kv_cache_dim``)."""
    return [
        (i.name, i.shape[1], i.shape[3] if isinstance(i.shape[3], int) else head_dim)
        for i in sess.get_inputs()
        if "past" in i.name
    ]


def greedy_ort(sess, ids, mask, steps, head_dim):
    """Greedy decoding by a plain onnxruntime loop: the first step feeds the whole (left-padded)
    prompt with empty past [B, kvH, 0, D]; each later step feeds the argmax token, the previous
    step's ``present.*`` as ``past_key_values.*``, the mask grown by a 1 and position_ids =
    cumsum(mask) - 1 (Hugging Face's convention; padding positions get 1).  Returns the tokens
    [B, steps], the first step's logits [B, S, V] and the per-step margin (min over rows)."""
    b = ids.shape[0]
    inputs = {i.name for i in sess.get_inputs()}
    past = {n: np.zeros((b, h, 0, d), np.float32) for n, h, d in past_inputs(sess, head_dim)}
    toks, margins, first = [], [], None
    cur = ids
    for _ in range(steps):
        pos = np.cumsum(mask, axis=1) - 1
        pos = np.where(mask == 0, 1, pos)[:, -cur.shape[1] :].astype(np.int64)
        feeds = {"input_ids": cur, "attention_mask": mask, **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = pos
        if "use_cache_branch" in inputs:
            feeds["use_cache_branch"] = np.array([first is not None])
        outs = run_step(sess, feeds)
        logits = outs["logits"]
        first = logits if first is None else first
        last = logits[:, -1, :]
        top2 = np.sort(last, axis=-1)[:, -2:]
        margins.append(float(np.min(top2[:, 1] - top2[:, 0])))
        cur = np.argmax(last, axis=-1).astype(np.int64)[:, None]
        toks.append(cur)
        mask = np.concatenate([mask, np.ones((b, 1), np.int64)], axis=1)
        past = {n: outs[n.replace("past_key_values", "present")] for n in past}
    return np.concatenate(toks, 1), first, np.array(margins, np.float32)
