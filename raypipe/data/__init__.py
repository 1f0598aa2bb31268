"""Question and corpus loaders (:mod:`raypipe.data.loaders`) and the bundled multi-hop QA sample (``mhqa/``)."""
