"""The unit tier: the engine, keys, records and outcomes in-process with fake builders, no torch.

Run it alone with ``pytest -q tests/unit`` (about 10 s on 2 cores); the normal suite collects
it too. No test here lowers a model or imports torch (conftest.py checks each module).

A package, so that its modules are ``unit.*`` (tests/ is on sys.path, pytest.ini): its
conftest.py never takes the place of tests/conftest.py as the module ``conftest``, which
the other tests import by that name.
"""
