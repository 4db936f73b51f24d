"""Small in-repo model factories used by the default pipeline and the tests."""
