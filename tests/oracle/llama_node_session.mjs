#!/usr/bin/env node
// llama_node_session.mjs: write ggsn session files with @fugood/llama.node (llama.cpp b10257, era G:
// ggsn v9 without outputs, quantized K/V Hadamard-rotated), through its JS API, for the zoo bed.
//
//   node tests/oracle/llama_node_session.mjs --prefix DIR --model M.gguf --prompt-file P
//        --out-dir OUT [--types f16/f16,q8_0/q8_0] [--fa on|off] [--n-ctx 4096]
//
// DIR is an npm prefix holding the package, outside the checkout, made with
//   npm install --prefix ~/.cache/kvsnap-oracle/llama.node-1.7.15 --ignore-scripts @fugood/llama.node@1.7.15
// (the prebuilt CPU addon comes with it as @fugood/node-llama-linux-x64; nothing is built).
// For every K/V pair it loads the model with those cache types (CPU only), evaluates the prompt with
// completion({prompt, n_predict: 1}), saves OUT/llama.node-<ctk>-<ctv>-fa<fa>.session with
// saveSession() (= llama_state_save_file with the completion's tokens), then loads the file back into
// a fresh context of the same types with loadSession() to check that llama.node itself accepts it.
// Prints one JSON line per file: {"file", "ctk", "ctv", "fa", "tokens", "bytes", "reload": "ok"|error}.
// Exit: 0 all written and reloaded, 1 a failure, 2 usage, 3 the package cannot be loaded.
import { createRequire } from 'node:module'
import fs from 'node:fs'
import path from 'node:path'

function usage(msg) {
  if (msg) console.error(`llama_node_session: ${msg}`)
  console.error('usage: llama_node_session.mjs --prefix DIR --model M.gguf --prompt-file P --out-dir OUT ' +
                '[--types f16/f16,q8_0/q8_0] [--fa on|off] [--n-ctx 4096]')
  process.exit(2)
}

const opt = { types: 'f16/f16,q8_0/q8_0', fa: 'on', 'n-ctx': '4096' }
const argv = process.argv.slice(2)
for (let i = 0; i < argv.length; i += 2) {
  if (!argv[i].startsWith('--') || i + 1 >= argv.length) usage(`bad argument ${argv[i]}`)
  opt[argv[i].slice(2)] = argv[i + 1]
}
for (const k of ['prefix', 'model', 'prompt-file', 'out-dir']) if (!opt[k]) usage(`missing --${k}`)
if (!['on', 'off'].includes(opt.fa)) usage('--fa must be on or off')

let llama
try {
  const require = createRequire(path.join(path.resolve(opt.prefix), 'node_modules', 'noop.js'))
  llama = require('@fugood/llama.node')
} catch (e) {
  console.error(`llama_node_session: cannot load @fugood/llama.node from ${opt.prefix}: ${e.message}`)
  process.exit(3)
}

const prompt = fs.readFileSync(opt['prompt-file'], 'utf8')
fs.mkdirSync(opt['out-dir'], { recursive: true })

async function open(ctk, ctv) {
  return llama.loadModel({
    model: opt.model,
    n_ctx: Number(opt['n-ctx']),
    n_batch: 512,
    n_ubatch: 512,
    n_threads: 2,
    n_gpu_layers: 0,
    n_parallel: 1,
    devices: ['CPU'],
    flash_attn_type: opt.fa,
    cache_type_k: ctk,
    cache_type_v: ctv,
    ctx_shift: false,
    use_mmap: true,
  })
}

let failed = 0
for (const pair of opt.types.split(',')) {
  const [ctk, ctv] = pair.split('/')
  const file = path.join(opt['out-dir'], `llama.node-${ctk}-${ctv}-fa${opt.fa}.session`)
  const rec = { file, ctk, ctv, fa: opt.fa }
  try {
    const ctx = await open(ctk, ctv)
    const tok = await ctx.tokenize(prompt)
    rec.prompt_tokens = tok.tokens.length
    await ctx.completion({ prompt, n_predict: 1, temperature: 0 })
    await ctx.saveSession(file)
    await ctx.release()
    rec.bytes = fs.statSync(file).size
    rec.tokens = fs.readFileSync(file).readUInt32LE(8)
    const ctx2 = await open(ctk, ctv)
    try {
      await ctx2.loadSession(file)
      rec.reload = 'ok'
    } catch (e) {
      rec.reload = `error: ${e.message}`
      failed++
    }
    await ctx2.release()
  } catch (e) {
    rec.error = e.message
    failed++
  }
  console.log(JSON.stringify(rec))
}
process.exit(failed ? 1 : 0)
