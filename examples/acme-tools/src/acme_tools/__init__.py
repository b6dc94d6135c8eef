"""Acme's Taskdesk tools (an example package): see acme_tools.tools."""
