"""Helpers shared by the test modules (fixtures, factories, fakes, launchers); a test module
imports from here, never from another test module (tests/integration/test_architecture.py checks it)."""
