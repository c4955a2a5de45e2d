"""A multimodal inference service to break on purpose (ViT-L/16, CLIP ViT-B/16, Whisper-large-v3 encoder).

Run from the repository root as ``python -m examples.inference.server`` (``--backend cpu`` needs only
numpy, Pillow and prometheus_client; ``--backend torch`` needs PyTorch, timm and transformers).
Only ``gpu.py``, ``models.py`` and the torch mode of ``neighbour.py`` import torch.  README.md
beside this file says how to run it, the knobs, the fallback file contract and the scenario table.
"""
