# cmake -DFROM=<model dir> -DTO=<dir> -P garbage_weights.cmake
# A copy of a model folder whose weights file is garbage (config and tokenizer intact).
file(REMOVE_RECURSE ${TO})
file(MAKE_DIRECTORY ${TO})
file(GLOB jsons ${FROM}/*.json)
file(COPY ${jsons} DESTINATION ${TO})
file(GLOB weights ${TO}/*.safetensors.index.json)
if(weights)
  file(REMOVE ${weights})
endif()
file(WRITE ${TO}/model.safetensors "this is not a safetensors file")
