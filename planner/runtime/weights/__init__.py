"""Weights in and out of a run: a rank builds only its blocks (seeded, or loaded from weights the user
has), and a run's checkpoint goes back to the model's own ``state_dict``.

    blocks = build_rank_blocks(zoo, 4, 8, seed=0, init_from="gpt2-small/")   # materialise.py
    consolidate("ckpt/", "out/")           # out/model.safetensors (+ config.json): consolidate.py

:mod:`~hetplan.runtime.weights.init_from` reads a Hugging Face ``save_pretrained`` folder or a
state_dict file one tensor at a time; :mod:`~hetplan.runtime.weights.materialise` builds a rank's
blocks on meta and fills them; :mod:`~hetplan.runtime.weights.consolidate` writes a checkpoint out.
"""
