"""An MCP client that no one here wrote: the official Python SDK (`pip install mcp`).

Usage: python3 mcp_client.py URL TOKEN. Lists the tools, posts a message, calls an unknown
channel, and prints the results as one JSON object for the e2e test to assert on.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client import streamable_http


def field(result, *names):
    """The SDK renamed fields between majors (structuredContent -> structured_content)."""
    for name in names:
        if hasattr(result, name):
            return getattr(result, name)
    return None


def payload(result):
    structured = field(result, "structured_content", "structuredContent")
    if structured:
        return structured
    return json.loads(result.content[0].text)


async def main(url, token):
    headers = {"Authorization": f"Bearer {token}"}
    if hasattr(streamable_http, "streamable_http_client"):  # mcp 2.x
        client = streamable_http.create_mcp_http_client(headers=headers)
        transport = streamable_http.streamable_http_client(url, http_client=client)
    else:  # mcp 1.x
        transport = streamable_http.streamablehttp_client(url, headers=headers)
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            post = await session.call_tool(
                "comms_post_message",
                {"channel": "home-ci-manager", "topic": "python", "body": "posted by the python mcp client",
                 "create_topic": True},
            )
            bad = await session.call_tool("comms_list_topics", {"channel": "no-such-channel"})
            print(json.dumps({
                "tools": [t.name for t in tools.tools],
                "post": payload(post),
                "post_is_error": field(post, "is_error", "isError"),
                "bad": payload(bad),
                "bad_is_error": field(bad, "is_error", "isError"),
            }))


asyncio.run(main(sys.argv[1], sys.argv[2]))
