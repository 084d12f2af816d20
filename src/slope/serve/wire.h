// The local protocol between `slope serve` (the front) and an instance's rank 0: frames over a
// unix stream socket, each a 4-byte little-endian length and that many bytes of JSON
// (docs/serving.md, "Front and instances"). One request frame, then one reply frame; the front
// never sends the next request before the reply.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace slope::serve {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// Writes one frame. Throws slope::Error when the peer is gone.
void write_frame(int fd, const nlohmann::json& message);
// Reads one frame; nullopt on a clean end of stream before the frame starts. Waits at most
// timeout_s (< 0: forever), polling `keep_waiting` every 200 ms (false: give up). Throws
// slope::Error on a truncated or oversized frame, bad JSON, a timeout or when given up.
std::optional<nlohmann::json> read_frame(int fd, double timeout_s = -1,
                                         const std::function<bool()>& keep_waiting = {});

// A unix socket listening at `path` (an old socket file there is replaced). Returns the fd.
int listen_unix(const std::string& path);
// Connects to the unix socket at `path`. Returns the fd; throws slope::Error.
int connect_unix(const std::string& path);

}  // namespace slope::serve
