"""Sandbox backends behind one `Executor` interface."""
