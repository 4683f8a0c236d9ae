"""The integration tests' ``running`` fixture (one ``memstream up``), for the cluster tests."""

from tests.integration.conftest import running

__all__ = ["running"]
