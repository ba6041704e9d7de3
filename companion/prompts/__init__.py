"""Prompts: the sets a harvest runs on, the families written or frozen for this project, and UltraChat.

=====================  ============================================================================
module                 holds
=====================  ============================================================================
``sets``               a prompt, the named sets, reading and writing prompt files
``chat_requests``      chat requests written for this project, in the paper's shape
``stdlib_requests``    coding requests quoting the Python standard library's documentation
``ultrachat``          the paper presets' sample of UltraChat-200k first turns
=====================  ============================================================================
"""
