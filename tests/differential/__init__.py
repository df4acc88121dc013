"""Differential tester: random programs over every way work enters the engine, against sequential NumPy.

``program`` generates programs (one integer seed each) and holds the reference interpreter (the contract,
statement by statement); ``runner`` runs a program on a real engine and collects its outcomes; ``check``
compares the two, minimizes a mismatching program and prints it.  ``test_differential`` is the CI budget,
``scripts/difftest.py`` the long mode.
"""
