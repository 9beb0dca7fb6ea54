"""nodeagent's built-in stage plugins. They are registered through the same entry-point group
(``nodeagent.plugins``) as third-party plugins and use only the public stage contract."""
