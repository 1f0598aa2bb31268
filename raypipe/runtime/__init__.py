"""The Ray layer the jobs share: joining or starting Ray, the retrieval actor service, Ray Train set-up.

Only this package and :mod:`raypipe.stages` import Ray; the domain packages below them are plain Python.
"""
