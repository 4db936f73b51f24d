"""The unit tier: the engine, keys, records and outcomes in-process with fake builders, no torch.

A package, so that its modules are ``unit.*`` (tests/ is on sys.path, pytest.ini): its
conftest.py never takes the place of tests/conftest.py as the module ``conftest``, which
the other tests import by that name.
"""
