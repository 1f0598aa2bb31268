"""Thin Ray adapters: the callable classes that Ray Data runs (map_batches / map_groups)."""
