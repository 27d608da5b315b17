"""Where the model runs: the model-backend seam and its factory (:mod:`.base`), onnxruntime on
the CPU (:mod:`.cpu`), and the accelerator (:mod:`.accelerator`) on its USB link
(:mod:`.link`), simulated by :mod:`.sim`."""
