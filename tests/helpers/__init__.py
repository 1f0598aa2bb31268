"""The project's own test support, imported one way (``from tests.helpers.X import ...``) by the tests.

``tests`` is a package, so pytest puts the repository root on ``sys.path``; a subprocess that imports these
modules runs from the repository root (``python -m tests.helpers.chaos_job``). Ray's workers get them by value
(:func:`tests.helpers.local_ray.init_local_ray`). Fakes that users can use in their own tests ship in
:mod:`raypipe.testing`; benchmarks import nothing from here.
"""
