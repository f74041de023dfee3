"""The widgets of the chat screen: the input, the messages, a chat tab and the status bar."""
