-- wrk's requests for bench/wrk.sh and bench/tokenize.sh: 64 conversations
-- sharing 8 system prompts, the same bytes on every run.  The caller sets
-- the sizes in words of 4 bytes (about a token each):
--   BODY_MODEL, BODY_SYSTEM_WORDS, BODY_USER_WORDS, BODY_MAX_TOKENS
local model = os.getenv("BODY_MODEL") or "m"
local system_words = tonumber(os.getenv("BODY_SYSTEM_WORDS") or "7800")
local user_words = tonumber(os.getenv("BODY_USER_WORDS") or "392")
local max_tokens = tonumber(os.getenv("BODY_MAX_TOKENS") or "64")

local bodies = {}
local function words(seed, n)
    local t = {}
    for i = 1, n do
        t[i] = string.char(97 + (seed * 7 + i * 13) % 26,
                           97 + (seed * 11 + i * 5) % 26,
                           97 + (i * 3 + seed) % 26, 32)
    end
    return table.concat(t)
end
for c = 1, 64 do
    bodies[c] = '{"model":"' .. model .. '","messages":[{"role":"system",'
        .. '"content":"' .. words(c % 8, system_words)
        .. '"},{"role":"user","content":"' .. words(1000 + c, user_words)
        .. '"}],"max_tokens":' .. max_tokens .. '}'
end
local n = 0
request = function()
    n = n + 1
    return wrk.format("POST", nil, {["Content-Type"] = "application/json"},
                      bodies[n % 64 + 1])
end
