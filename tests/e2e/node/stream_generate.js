// A plain Node.js gRPC client (@grpc/grpc-js + @grpc/proto-loader on protos/) streaming
// InferenceService.GenerateStream through Envoy. Prints {"events": [...], "text": "..."}.
// Usage: node stream_generate.js HOST:PORT PROTO_INCLUDE_DIR... (protos/, googleapis, protovalidate)
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, ...includeDirs] = process.argv.slice(2);
const definition = protoLoader.loadSync('mstar/v1/inference_service.proto', {
  includeDirs, keepCase: true, longs: String, enums: String, oneofs: true,
});
const mstar = grpc.loadPackageDefinition(definition).mstar.v1;
const client = new mstar.InferenceService(target, grpc.credentials.createInsecure());

const events = [];
let text = '';
const call = client.GenerateStream(
  {input: {text: 'The capital of France is', model_kwargs: {sampling: {max_tokens: 6, temperature: 0}}}},
  {deadline: Date.now() + 60000});
call.on('data', (message) => {
  events.push(message.event);
  if (message.chunk) text += message.chunk.text;
});
call.on('error', (err) => {
  console.error(`${err.code} ${err.details}`);
  process.exit(1);
});
call.on('end', () => {
  console.log(JSON.stringify({events, text}));
  client.close();
});
