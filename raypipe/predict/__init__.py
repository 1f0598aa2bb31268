"""Predictors of P_i and U_i: the relation cross-encoders, the windowed MLP head, their evaluation and the bundle."""
