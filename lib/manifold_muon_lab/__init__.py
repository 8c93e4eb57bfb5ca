"""manifold_muon_lab: the experiments of the book, on top of the ``manifold_muon`` optimizers.

* ``models``      GPT-2 and Qwen3-like, one file each; ``build_model(family, **fields)``
* ``data``        token data prepared once into uint16 files (the embedded King James Bible, OpenWebText,
                  any local text), and ``Batches``, the training loop's sampler
* ``config``      ``TrainConfig``, YAML presets (read from a folder you give) and the checks that refuse a
                  bad config before any work
* ``train``       one run: ``train(cfg)``, and the ``Trainer`` it drives (setup, step, evaluate, save, hooks);
                  also under ``torchrun``, with ``checkpoint``, ``metrics`` (``Recorder``) and ``distributed``
                  in their own modules; ``launch`` is torchrun with one sentence and the run's exit code
* ``sweep``       independent runs, ``workers`` at a time (``concurrent.futures``, spawned processes); a run
                  failure (``config.RunError``...) is recorded, a bug stops the sweep
* ``provenance``  what produced a result (commit, parameters, versions, hardware, wall time), atomic writes

It knows nothing of the book: data and preset folders are arguments (defaults relative to the current
directory).
"""

__version__ = "0.2.0"
