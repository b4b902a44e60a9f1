"""DDLF's benchmarks, one package per subject (see README.md, the results page).

Every script runs as a file from a checkout, e.g.
``python benchmarks/training/train_compare.py --help``; each puts the checkout's root on
``sys.path`` first, so ``benchmarks.*`` (the shared ``protocol`` and the emulation
harness) imports the same way from any of them. The tests import the modules by these
names too (``from benchmarks.peers import torch_compare``).
"""
