from mcp_sandbox.cli import main

main()
