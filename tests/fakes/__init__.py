"""Test doubles that stand in for things the test machines lack (an NVIDIA driver: :mod:`fakes.fakenvml`)."""
