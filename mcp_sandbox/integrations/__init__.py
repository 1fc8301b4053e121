"""Adapters that let other frameworks run their code in mcp-sandbox; each imports its framework
itself, so importing mcp_sandbox never does (`mcp_sandbox.integrations.dspy` needs DSPy)."""
