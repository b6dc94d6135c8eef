"""The demo toolset (``TASKDESK_TOOLSETS=demo``, the default): its tools in ``tools`` and its
stand-in payment provider's table in ``models``. A Django app of its own (label
``demo_toolset``), so that the table lives with the tools that use it, not in the task core.
"""
