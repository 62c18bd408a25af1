// The official OpenAI SDK for JavaScript as a user's program runs it,
// pointed at nginx (kv_aware) in front of kvsim.  One scenario a run:
//
//   NODE_PATH=build/js/node_modules \
//       node t/js/openai-client.js BASE_URL SCENARIO [JSON-OPTIONS]
//
// BASE_URL as the SDK takes it (http://127.0.0.1:PORT/v1).  Prints one
// JSON object on stdout: what the SDK handed back, for t/60-openai-js.t to
// judge.  Exits 1 with the SDK's error on stderr when a call fails.
//
// Scenarios: chat, chat-stream, completion, completion-stream (one
// request each), cached (one prompt asked twice), abort (a stream left
// after a few chunks, then one more request), conversation (several
// two-turn conversations, turn two carrying turn one's answer).

'use strict';

const { OpenAI } = require('openai');

const [baseURL, scenario, optText] = process.argv.slice(2);
const opt = optText ? JSON.parse(optText) : {};
const model = opt.model || 'kvsim';

const client = new OpenAI({
    baseURL,
    apiKey: 'sk-kv-aware-test',
    maxRetries: 0,              // a failure must show, not be retried away
    timeout: 30000,
});

// long enough to fill many blocks (256 bytes each), no JSON escapes
function systemPrompt(tag, words) {
    const w = [];
    for (let i = 0; i < (words || 600); i++) {
        w.push(`${tag}${String(i).padStart(4, '0')}`);
    }
    return `You are assistant ${tag}. ` + w.join(' ');
}

function usageOf(u) {
    if (!u) {
        return null;
    }
    return {
        prompt: u.prompt_tokens,
        completion: u.completion_tokens,
        total: u.total_tokens,
        cached: u.prompt_tokens_details
            ? u.prompt_tokens_details.cached_tokens : undefined,
    };
}

async function chat(messages, maxTokens) {
    const { data, response } = await client.chat.completions.create({
        model, messages, max_tokens: maxTokens || 8,
    }).withResponse();
    return {
        object: data.object,
        id: data.id,
        role: data.choices[0].message.role,
        content: data.choices[0].message.content,
        finish: data.choices[0].finish_reason,
        usage: usageOf(data.usage),
        server: response.headers.get('x-kvsim-server'),
        body_server: data.kvsim ? data.kvsim.server : null,
    };
}

async function chatStream(messages, maxTokens) {
    const { data: stream, response } = await client.chat.completions.create({
        model, messages, max_tokens: maxTokens || 8, stream: true,
        stream_options: { include_usage: true },
    }).withResponse();
    const out = {
        chunks: 0, content: '', usage: null, objects: {}, roles: [],
        server: response.headers.get('x-kvsim-server'),
        type: response.headers.get('content-type'),
    };
    for await (const chunk of stream) {
        out.chunks++;
        out.objects[chunk.object] = 1;
        if (chunk.kvsim) {
            out.body_server = chunk.kvsim.server;
        }
        for (const c of chunk.choices) {
            if (c.delta.role) {
                out.roles.push(c.delta.role);
            }
            out.content += c.delta.content || '';
            if (c.finish_reason) {
                out.finish = c.finish_reason;
            }
        }
        if (chunk.usage) {
            out.usage = usageOf(chunk.usage);
        }
    }
    return out;
}

async function completion(prompt, maxTokens) {
    const { data, response } = await client.completions.create({
        model, prompt, max_tokens: maxTokens || 8,
    }).withResponse();
    return {
        object: data.object,
        text: data.choices[0].text,
        finish: data.choices[0].finish_reason,
        usage: usageOf(data.usage),
        server: response.headers.get('x-kvsim-server'),
        body_server: data.kvsim ? data.kvsim.server : null,
    };
}

async function completionStream(prompt, maxTokens) {
    const stream = await client.completions.create({
        model, prompt, max_tokens: maxTokens || 8, stream: true,
    });
    const out = { chunks: 0, text: '', usage: null, objects: {} };
    for await (const chunk of stream) {
        out.chunks++;
        out.objects[chunk.object] = 1;
        if (chunk.kvsim) {
            out.body_server = chunk.kvsim.server;
        }
        out.text += chunk.choices.map((c) => c.text).join('');
        if (chunk.usage) {
            out.usage = usageOf(chunk.usage);
        }
    }
    return out;
}

// reads `after` chunks of a long stream, then leaves the loop: the SDK
// aborts the fetch, which closes the connection to nginx
async function abortStream(messages, maxTokens, after) {
    const stream = await client.chat.completions.create({
        model, messages, max_tokens: maxTokens, stream: true,
    });
    let chunks = 0;
    let server = null;
    const t0 = Date.now();
    for await (const chunk of stream) {
        if (chunk.kvsim) {
            server = chunk.kvsim.server;
        }
        if (++chunks >= after) {
            break;
        }
    }
    return { chunks, server, ms: Date.now() - t0 };
}

const scenarios = {
    'chat': () => chat([
        { role: 'system', content: systemPrompt('chat', 200) },
        { role: 'user', content: 'Say something.' },
    ], opt.max_tokens),

    'chat-stream': () => chatStream([
        { role: 'system', content: systemPrompt('stream', 200) },
        { role: 'user', content: 'Say something, slowly.' },
    ], opt.max_tokens),

    'completion': () => completion(systemPrompt('text', 200)
                                   + ' Continue:', opt.max_tokens),

    'completion-stream': () => completionStream(systemPrompt('textstream',
                                                             200)
                                                + ' Continue:',
                                                opt.max_tokens),

    // the same long system prompt, two questions: the second finds it
    // cached where the first put it, whole and streamed
    'cached': async () => {
        const sys = { role: 'system', content: systemPrompt('cache', 800) };
        const first = await chat([sys, { role: 'user', content: 'one?' }]);
        const second = await chat([sys, { role: 'user', content: 'two?' }]);
        const third = await chatStream([sys,
                                        { role: 'user', content: 'three?' }]);
        return { first, second, third };
    },

    'abort': async () => {
        const aborted = await abortStream([
            { role: 'system', content: systemPrompt('abort', 200) },
            { role: 'user', content: 'Talk for a long time.' },
        ], opt.max_tokens || 4000, opt.after || 3);
        const next = await chat([
            { role: 'system', content: systemPrompt('after', 200) },
            { role: 'user', content: 'Still there?' },
        ]);
        return { aborted, next };
    },

    // turn one, then turn two with turn one's question and answer: the
    // SDK's usual loop of a chat application
    'conversation': async () => {
        const users = opt.users || 6;
        const out = [];
        for (let u = 0; u < users; u++) {
            const history = [
                { role: 'system', content: systemPrompt(`user${u}x`, 400) },
                { role: 'user', content: `Hello, I am user ${u}.` },
            ];
            const turns = [];
            for (let t = 1; t <= (opt.turns || 2); t++) {
                const r = await chat(history, 32);
                turns.push({ server: r.server, body_server: r.body_server,
                             usage: r.usage });
                history.push({ role: 'assistant', content: r.content });
                history.push({ role: 'user',
                               content: `Turn ${t + 1}: ` + 'tell me more '
                                        .repeat(40) });
            }
            out.push(turns);
        }
        return { conversations: out };
    },
};

async function main() {
    const run = scenarios[scenario];
    if (!run) {
        throw new Error(`unknown scenario "${scenario}"`);
    }
    const result = await run();
    process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((err) => {
    process.stderr.write(`openai-client ${scenario}: ${err.stack || err}\n`);
    process.exit(1);
});
